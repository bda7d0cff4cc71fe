"""Admin configuration as traitlets, and the quotas in force."""
