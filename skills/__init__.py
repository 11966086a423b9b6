"""Skill bundles, trust, and the Skill SDK."""
