"""Migration scripts; each names the revision it follows in ``down_revision``."""
