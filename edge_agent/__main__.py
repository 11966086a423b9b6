"""``python -m edge_agent run ...``: the agent without the ``edgeskill`` command around it."""

import sys

from edge_agent.cli import main

sys.exit(main())
