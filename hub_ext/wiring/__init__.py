"""Wiring gpupool into a running JupyterHub: the composition root, `configure(c)`, the hub adapter,
background tasks, stopping, templates, crash points and log redaction."""
