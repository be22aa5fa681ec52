"""The data modules and what only they use."""
