"""Load the gpupool chart's settings (its ConfigMap `gpupool-config`, mounted into the z2jh hub)
into the hub's traitlets config. The chart renders them as traitlets config already — a JSON
object keyed by configurable class and trait name (GPUPool, GPUKubeSpawner, TrainPool,
KubeSpawner), the z2jh way — so nothing is translated here: the file is read by traitlets' JSON
config loader and merged. In z2jh's hub.extraConfig::

    from gpupool.kube.chart_config import load_chart_config
    load_chart_config(c, "/etc/gpupool/hub-config.json")
"""

from __future__ import annotations

import logging
from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import JSONFileConfigLoader

# the file in the ConfigMap; an older chart wrote its own values as "gpupool.json"
CONFIG_FILE = "hub-config.json"
OLD_FILE = "gpupool.json"
log = logging.getLogger(__name__)


class ChartConfigError(ValueError):
    """The mounted file is not the chart's traitlets config (an older chart, or not JSON)."""


def read_chart_config(path: str | Path) -> Config:
    """The chart's traitlets config, as traitlets reads a JSON config file."""
    path = Path(path)
    try:
        loaded = JSONFileConfigLoader(path.name, str(path.parent)).load_config()
    except ValueError as err:  # JSONDecodeError is one
        raise ChartConfigError(f"{path}: not the gpupool chart's traitlets config: {err}") from None
    sections = [key for key in loaded if key[:1].isupper()]
    if not sections:  # {"projects": ..., "build": ...}: the values of a chart before this hub
        raise ChartConfigError(
            f"{path} holds no configurable class (c.GPUPool, c.TrainPool, ...): it was rendered by"
            f" an older gpupool chart; upgrade the gpupool chart with this hub image"
            f" (helm upgrade gpupool helm/gpupool ...)"
        )
    return loaded


def load_chart_config(c: Config, path: str | Path = f"/etc/gpupool/{CONFIG_FILE}") -> Config:
    """Merge the chart's traitlets config into `c` (later lines of hub.extraConfig still win);
    returns what the chart set."""
    loaded = read_chart_config(path)
    c.merge(loaded)
    return loaded


def apply_chart_config(c: Config, path: str | Path) -> Config:
    """Deprecated: the z2jh overlay's old call. Loads the chart's traitlets config (from
    hub-config.json beside `path` when `path` is an older chart's gpupool.json, now gone)."""
    path = Path(path)
    if path.name == OLD_FILE and not path.exists():
        path = path.with_name(CONFIG_FILE)
    log.warning(
        "gpupool.kube.chart_config.apply_chart_config is deprecated: use"
        ' load_chart_config(c, "/etc/gpupool/%s") (helm/z2jh-values.yaml)',
        CONFIG_FILE,
    )
    return load_chart_config(c, path)
