"""The GPU pool admin page, served by the hub itself so it extends JupyterHub's `page.html`
(navigation bar, user menu, theme): GPUs and who holds them, allocation against use over time,
train jobs with why each waits and Cancel, projects, group totals and build quotas to change."""

from gpupool.admin.handlers import PAGE_PATH, register

__all__ = ["PAGE_PATH", "register"]
