"""cloud."""
