"""The ``edgeskill`` command line: the composition root over hub, agent and converters."""
