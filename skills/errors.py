"""Exception roots of the skills package, by whose fault it is."""


class SkillError(Exception):
    """Root of everything the skills package raises."""


class ManifestError(SkillError):
    """A ``skill.toml`` is missing, malformed or inconsistent (the bundle author's fault)."""


class BundleError(SkillError):
    """A bundle's content is wrong: missing files, hash or size mismatch."""


class DriftReferenceError(BundleError):
    """A bundle's drift reference is malformed, inconsistent or over a cap.

    The bundle's publisher is at fault; the agent still runs the skill, without
    drift statistics against that reference.
    """


class ArchiveError(BundleError):
    """An archive is unsafe or exceeds a cap: traversal, links, devices, bombs."""


class TrustError(SkillError):
    """TUF verification failed: bad signature, hash, version, expiry or an untrusted key."""


class FetchError(SkillError):
    """A file could not be fetched from the hub (network or hub side)."""


class TensorCodecError(SkillError):
    """A split-inference tensor payload is malformed, exceeds a cap, or cannot be encoded."""
