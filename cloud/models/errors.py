"""Errors of the model factory; all are :class:`cloud.errors.HubError`."""

from __future__ import annotations

from cloud.errors import HubError

__all__ = ["BlobError", "FactoryError", "JobError"]


class FactoryError(HubError):
    """A model factory step failed: bad data set, corrupt or unsupported model, failed check."""


class BlobError(FactoryError):
    """A blob is missing, over its cap, or does not match its hash."""


class JobError(FactoryError):
    """A training job cannot be started, or its process failed."""
