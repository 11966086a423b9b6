"""Field caps of the wire contract, in one place.

The hub's store, its session core, the agent's reports and the skill
manifest all check against these numbers, so a value one side accepts the
other side accepts too. Lengths are in characters unless the name says bytes.
"""

from __future__ import annotations

__all__ = [
    "DEVICE_ID_PATTERN",
    "MAX_CONFIG_ENTRIES",
    "MAX_CONFIG_VALUE_BYTES",
    "MAX_DEVICE_ID_CHARS",
    "MAX_DEVICE_LABELS",
    "MAX_ENVELOPE_BYTES",
    "MAX_ERROR_CHARS",
    "MAX_FETCH_REQUEST_BYTES",
    "MAX_LABEL_KEY_CHARS",
    "MAX_LABEL_VALUE_CHARS",
    "MAX_MESSAGE_ID_CHARS",
    "MAX_METRICS",
    "MAX_METRIC_NAME_CHARS",
    "MAX_NAME_CHARS",
    "MAX_OFFER_BYTES",
    "MAX_OFFER_FILES",
    "MAX_PATH_CHARS",
    "MAX_REPORTED_SKILLS",
    "MAX_STATE_CHARS",
    "MAX_VARIANT_CHARS",
    "MAX_VERSION_CHARS",
]

#: No control message is larger than this; bulk data goes through Fetch.
MAX_ENVELOPE_BYTES = 256 * 1024
#: Metadata a hub sends along with a desired state (timestamp, snapshot, targets):
#: past this, it sends none and the device fetches the files as usual.
MAX_OFFER_BYTES = 64 * 1024
MAX_OFFER_FILES = 3
#: A fetch request is a path, an offset and a cap.
MAX_FETCH_REQUEST_BYTES = 4096

MAX_DEVICE_ID_CHARS = 128
#: A device id: a letter or digit, then letters, digits, ``.``, ``_`` or ``-``.
DEVICE_ID_PATTERN = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_DEVICE_ID_CHARS - 1}}}"
MAX_MESSAGE_ID_CHARS = 64

#: Skill names, config keys and other identifiers.
MAX_NAME_CHARS = 64
MAX_VERSION_CHARS = 64
#: A skill's state in a report (``running``, ``failed``, ...).
MAX_STATE_CHARS = 32
#: The error text of a skill in a report.
MAX_ERROR_CHARS = 2000
#: The model variant a skill runs, in a report.
MAX_VARIANT_CHARS = 256
MAX_REPORTED_SKILLS = 64

#: Labels a device may carry (its register message).
MAX_DEVICE_LABELS = 32
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 63

MAX_METRICS = 64
MAX_METRIC_NAME_CHARS = 64

MAX_CONFIG_ENTRIES = 64
MAX_CONFIG_VALUE_BYTES = 1024

#: A path inside a bundle or the hub's repository.
MAX_PATH_CHARS = 255
