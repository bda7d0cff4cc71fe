"""Where train jobs run: local processes (embedded)."""
