"""Metadata sent along with a desired state, so a device need not ask the hub for it.

Upgrading to a new version, a device refreshes its TUF metadata before it
downloads the bundle: root N+1, the timestamp, the snapshot, the targets, each a
round trip to the hub asked for once the one before it is verified. The hub
knows every answer when it tells the device what to run, so it sends them along
(:func:`read_offer`, :func:`offer_message`) and the device hands them to ngclient
when it asks for those very paths (:meth:`skills.trust.TrustClient.offer`). The
upgrade is then one round trip, the bundle's.

Offered files come from the same hub as fetched ones and are trusted no more:
ngclient verifies each as it would a download. The newest root's version stands
in for the hub's "no such file" to a device asking for root N+1, which the same
hub would give. An offer may be stale (a retained MQTT message read long after it
was sent): the client takes one only for the next download, and a download that
fails with an offer is made again without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protos import edgeskill_pb2 as pb
from protos.limits import MAX_OFFER_BYTES
from skills.errors import SkillError
from skills.trust._ahead import meta_version, metadata_path

__all__ = ["MetadataOffer", "from_message", "offer_message", "read_offer"]

ROOT = "metadata/root.json"
TIMESTAMP = "metadata/timestamp.json"
#: Largest root read to learn its version (it is not sent: it is not in the offer).
ROOT_READ_BYTES = 512 * 1024

#: Reads a served repository file of at most ``max_bytes`` whole (``TrustRepository.read``).
ReadFn = Callable[[str, int], bytes]


@dataclass(frozen=True)
class MetadataOffer:
    """The hub's newest root version and the metadata files a refresh would ask for.

    Attributes:
        root_version: The version of the hub's newest root.
        files: Fetch path (``metadata/<file>``) -> the file's bytes.
    """

    root_version: int
    files: Mapping[str, bytes]


def read_offer(read: ReadFn, max_bytes: int = MAX_OFFER_BYTES) -> MetadataOffer | None:
    """What a device refreshing now would fetch: the timestamp and the files it names.

    The root is read before and after the chain; None when it changed meanwhile,
    when a file is missing or not what it should be, or when the files together
    are over ``max_bytes`` (a device then fetches them as usual).
    """
    try:
        before = _root_version(read(ROOT, ROOT_READ_BYTES))
        timestamp = read(TIMESTAMP, max_bytes)
        snapshot_path = _named(timestamp, "snapshot", before.consistent)
        snapshot = read(snapshot_path, max_bytes)
        targets_path = _named(snapshot, "targets", before.consistent)
        targets = read(targets_path, max_bytes)
        after = _root_version(read(ROOT, ROOT_READ_BYTES))
    except (OSError, SkillError, ValueError, TypeError, KeyError, RecursionError):
        return None  # missing, a bad path or over the cap (TrustError), or not metadata
    if after != before or len(timestamp) + len(snapshot) + len(targets) > max_bytes:
        return None
    files = {TIMESTAMP: timestamp, snapshot_path: snapshot, targets_path: targets}
    return MetadataOffer(before.version, files)


def offer_message(offer: MetadataOffer) -> pb.MetadataOffer:
    """The offer as it travels beside a desired state."""
    files = [pb.MetadataFile(path=path, data=data) for path, data in offer.files.items()]
    return pb.MetadataOffer(root_version=offer.root_version, files=files)


def from_message(message: pb.MetadataOffer) -> MetadataOffer:
    """An offer received (its bounds checked with its envelope: ``validate_envelope``)."""
    return MetadataOffer(message.root_version, {f.path: f.data for f in message.files})


@dataclass(frozen=True)
class _Root:
    version: int
    consistent: bool


def _signed(data: bytes, role: str) -> dict[str, Any]:
    signed = json.loads(data)["signed"]
    if not isinstance(signed, dict) or signed.get("_type") != role:
        raise ValueError(f"not {role} metadata")
    return signed


def _root_version(data: bytes) -> _Root:
    signed = _signed(data, "root")
    return _Root(meta_version(signed), bool(signed.get("consistent_snapshot")))


def _named(data: bytes, role: str, consistent: bool) -> str:
    """The path of the ``role`` file the metadata ``data`` names."""
    owner = "timestamp" if role == "snapshot" else "snapshot"
    version = meta_version(_signed(data, owner)["meta"][f"{role}.json"])
    return metadata_path(role, version, consistent=consistent)
