"""edge_agent."""
