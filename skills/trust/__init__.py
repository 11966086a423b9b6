"""TUF trust for skill bundles: the hub's repository and the agent's verifying client.

The hub signs every bundle into a :class:`TrustRepository`; the agent gets
every file through :class:`TrustClient`, which verifies it with python-tuf's
ngclient (rollback, freeze, mix-and-match and tamper protection).
"""

from skills.trust._names import check_target_name
from skills.trust.client import FetchFn, TrustClient, TrustLimits
from skills.trust.repository import TargetRef, TrustRepository

__all__ = [
    "FetchFn",
    "TargetRef",
    "TrustClient",
    "TrustLimits",
    "TrustRepository",
    "check_target_name",
]
