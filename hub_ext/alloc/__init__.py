"""The hub process's owner of allocation state, and what it asks of the services built on it."""
