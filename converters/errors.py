"""Exception roots of the converters package."""


class ConverterError(Exception):
    """Root of everything the converters package raises."""


class ConversionError(ConverterError):
    """A model could not be converted, or the converted model does not match its source."""


class ToolMissingError(ConversionError):
    """An external tool a target needs (``atc``, ``trtexec``, an optional package) is absent."""


class DatasetError(ConverterError):
    """A dataset folder or file is malformed."""


class TrainingError(ConverterError):
    """A training job failed."""


class CompressionError(ConverterError):
    """A compression step (quantisation, pruning, distillation) got options it cannot honour."""
