"""The tornado application behind /services/gpupool/."""

from __future__ import annotations

import re
import secrets
from typing import TYPE_CHECKING, Any

from jupyterhub.services.auth import HubOAuth
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.routing import PathMatches

from gpupool.api.auth import SERVICES_KEY, ApiRoot, OAuthCallback
from gpupool.api.bodies import DEFAULT_MAX_BODY
from gpupool.api.culler import ExtendHandler, ReportHandler, StatusHandler, TargetsHandler
from gpupool.api.demo import ROUTES as DEMO_ROUTES
from gpupool.api.extend_page import ExtendPage
from gpupool.api.hibernation import ROUTES as HIBERNATION_ROUTES
from gpupool.api.jobs import ROUTES as JOB_ROUTES
from gpupool.api.page import StatusPage
from gpupool.api.parking import ROUTES as PARKING_ROUTES
from gpupool.api.pool import EventsHandler, MeHandler, PoolHandler
from gpupool.api.quotas import QuotasHandler
from gpupool.api.usage import ROUTES as USAGE_ROUTES
from gpupool.hub.root_key import ROOT_KEY

if TYPE_CHECKING:
    from gpupool.api.services import ApiServices

# The API's routes, each module's own (jobs, parking, demo, usage) spliced in: a constant, as
# JupyterHub's handler modules list theirs (`default_handlers`); nothing adds to it at run time.
ROUTES: tuple[tuple[str, type[web.RequestHandler]], ...] = (
    ("api/pool", PoolHandler),
    ("api/me", MeHandler),
    ("api/events", EventsHandler),
    ("api/quotas", QuotasHandler),
    ("api/culler/targets", TargetsHandler),
    ("api/culler/report", ReportHandler),
    ("api/culler/status", StatusHandler),
    ("api/culler/extend", ExtendHandler),
    ("culler/extend", ExtendPage),
    *JOB_ROUTES,
    *PARKING_ROUTES,
    *DEMO_ROUTES,
    *USAGE_ROUTES,
    *HIBERNATION_ROUTES,
    ("", StatusPage),
)


def body_limits(app: web.Application) -> list[tuple[re.Pattern[str], int]]:
    """(path pattern, largest body) of each route, for api/bodies.py."""
    return [
        (rule.matcher.regex, getattr(rule.target, "max_body", DEFAULT_MAX_BODY))
        for rule in app.wildcard_router.rules
        if isinstance(rule.matcher, PathMatches)
    ]


def make_app(root: ApiRoot, hub_auth: HubOAuth, services: ApiServices) -> web.Application:
    """The API app of the hub `root`: its handlers read the root as `self.settings[ROOT_KEY]` and
    the running services as `self.services` (gpupool.api.services)."""
    prefix = hub_auth.base_url
    handlers: list[Any] = [(url_path_join(prefix, "oauth_callback"), OAuthCallback)]
    handlers += [(url_path_join(prefix, path) if path else prefix, h) for path, h in ROUTES]
    settings = {
        ROOT_KEY: root,
        SERVICES_KEY: services,
        "hub_auth": hub_auth,
        "cookie_secret": secrets.token_bytes(32),
        "xsrf_cookies": False,
    }
    return web.Application(handlers, **settings)
