"""The gpupool REST API and pages, served from the hub process as the `gpupool` service."""

from gpupool.api.app import make_app

__all__ = ["make_app"]
