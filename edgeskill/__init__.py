"""edgeskill."""
