"""Whether a device is online, derived from when it last spoke and how often it must.

The hub never stores "online" as a fact: a flag written by a process that died
afterwards stays true forever. What it stores is when each device's last
message came (``last_seen_ms``), the heartbeat interval the hub gave the
device when it connected (``heartbeat_ms``), and whether the hub saw its
connection end since (``connected``). Whoever reads decides with its own clock:
a device is online while it is connected and its last message is no older
than :data:`MISSED_BEATS` heartbeat intervals. So a device whose agent was
killed turns offline on time whether or not a hub was running to notice, and
a restarted hub does not bring back a stale "online".

The rule exists twice, as a pure function (:func:`presence`) and as an SQL
expression over any columns (:func:`online_clause`) for counting in the
database; the tests hold them to the same answers.

Views of the fleet show a third value (:func:`fleet_presence`): ``stale``,
a device that is not online although the hub never saw its connection end
(it went quiet without a goodbye: the hub was down, or the broker's last
will was lost), apart from ``offline``, whose end the hub saw.
"""

from __future__ import annotations

from typing import Final, Literal

from sqlalchemy import ColumnElement, and_, case, literal

from cloud.errors import ValidationError

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_HEARTBEAT_S",
    "MAX_HEARTBEAT_S",
    "MIN_HEARTBEAT_S",
    "MISSED_BEATS",
    "PRESENCES",
    "FleetPresence",
    "Presence",
    "fleet_presence",
    "heartbeat_seconds",
    "online_clause",
    "presence",
    "stale_after_ms",
]

Presence = Literal["online", "offline"]
#: Presence as the console shows it: :data:`Presence` with ``stale`` split off ``offline``.
FleetPresence = Literal["online", "stale", "offline"]
PRESENCES: Final = ("online", "stale", "offline")

#: The interval a hub sends in ``Welcome`` unless told otherwise.
DEFAULT_HEARTBEAT_S: Final = 5
#: The interval assumed for a device whose interval was never recorded (``heartbeat_ms`` 0).
DEFAULT_HEARTBEAT_MS: Final = DEFAULT_HEARTBEAT_S * 1000
#: The intervals a hub may ask for: at least a second (the agent's floor), at most five minutes.
MIN_HEARTBEAT_S: Final = 1
MAX_HEARTBEAT_S: Final = 300
#: Heartbeats a device may miss in a row and still count as online.
MISSED_BEATS: Final = 2


def stale_after_ms(heartbeat_ms: int) -> int:
    """How old a device's last message may be while it still counts as online.

    ``heartbeat_ms`` 0 (or less) means the interval is not known: the default applies.
    """
    interval = heartbeat_ms if heartbeat_ms > 0 else DEFAULT_HEARTBEAT_MS
    return MISSED_BEATS * interval


def presence(last_seen_ms: int, heartbeat_ms: int, connected: bool, now_ms: int) -> Presence:
    """Whether a device is online at ``now_ms``, by the reader's clock.

    Args:
        last_seen_ms: when the device's last message (register or heartbeat) arrived.
        heartbeat_ms: the interval the hub gave it; 0 when not known (the default applies).
        connected: False once the hub saw the device's connection end, until it speaks again.
        now_ms: the reader's wall clock.

    Returns:
        ``"online"`` while connected and the last message is at most
        :data:`MISSED_BEATS` intervals old; ``"offline"`` otherwise. A last message
        stamped slightly in the future (another host's clock) counts as fresh.
    """
    if connected and now_ms - last_seen_ms <= stale_after_ms(heartbeat_ms):
        return "online"
    return "offline"


def fleet_presence(
    last_seen_ms: int, heartbeat_ms: int, connected: bool, now_ms: int
) -> FleetPresence:
    """A device's presence at ``now_ms``: :func:`presence` with ``stale`` split off.

    Returns:
        ``"online"`` as :func:`presence` says; ``"stale"`` when not online but
        still marked connected; ``"offline"`` otherwise.
    """
    if presence(last_seen_ms, heartbeat_ms, connected, now_ms) == "online":
        return "online"
    return "stale" if connected else "offline"


def online_clause(
    last_seen_ms: ColumnElement[int],
    heartbeat_ms: ColumnElement[int],
    connected: ColumnElement[bool],
    now_ms: int,
) -> ColumnElement[bool]:
    """The rule of :func:`presence` as an SQL condition over the given columns.

    Use it to count or select online devices in the database, e.g.
    ``online_clause(devices.c.last_seen_ms, devices.c.heartbeat_ms, devices.c.online, now)``.
    """
    interval = case((heartbeat_ms > 0, heartbeat_ms), else_=literal(DEFAULT_HEARTBEAT_MS))
    return and_(connected, last_seen_ms >= literal(now_ms) - MISSED_BEATS * interval)


def heartbeat_seconds(value: int | str) -> int:
    """Check a heartbeat interval a person gave (seconds, a whole number or its text).

    Returns:
        The interval in seconds.

    Raises:
        ValidationError: not a whole number from :data:`MIN_HEARTBEAT_S` to
            :data:`MAX_HEARTBEAT_S`.
    """
    expected = f"{MIN_HEARTBEAT_S} to {MAX_HEARTBEAT_S} seconds"
    if isinstance(value, bool):
        raise ValidationError(f"heartbeat {value!r} is not whole seconds: expected {expected}")
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 6):
            shown = value if len(value) <= 12 else f"{value[:12]}..."
            raise ValidationError(f"heartbeat {shown!r} is not whole seconds: expected {expected}")
        value = int(text)
    if not MIN_HEARTBEAT_S <= value <= MAX_HEARTBEAT_S:
        raise ValidationError(f"heartbeat {value} s is out of range: expected {expected}")
    return value
