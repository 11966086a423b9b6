"""``edgeskill sim``: a fleet of real agents, many per process, against real hub processes.

Every simulated device is a real :class:`edge_agent.agent.Agent` (real
transport, outbox, TUF client, installs and desired-state checks); only the
skill's control process is simulated (:mod:`edgeskill.sim.runtime`), with
per-version install failures, accuracy and latency, scaled by the device's
board. Faults (:mod:`edgeskill.sim.faults`) drop connections, crash skills
and slow links. Worker processes (:mod:`edgeskill.sim.worker`) each run a
share of the agents on one event loop; :mod:`edgeskill.sim.run` starts the hubs
and workers, deploys, and reports.
"""

from edgeskill.sim.params import SimSettings, VersionSpec

__all__ = ["SimSettings", "VersionSpec"]
