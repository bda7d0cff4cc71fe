"""GPU-aware idle culler: a JupyterHub service that culls idle workspaces."""
