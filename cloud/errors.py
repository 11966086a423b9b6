"""Exception roots of the hub."""


class HubError(Exception):
    """Root of everything the hub raises."""


class StoreError(HubError):
    """The registry store failed or refused a change."""


class NotFoundError(StoreError):
    """A record that was asked for does not exist."""


class ConflictError(StoreError):
    """A change collides with what exists (an immutable version re-pushed, a duplicate name)."""


class ValidationError(HubError):
    """Input from a user or a device is malformed (selector, label, version)."""


class TransportError(HubError):
    """The hub's side of a transport failed."""
