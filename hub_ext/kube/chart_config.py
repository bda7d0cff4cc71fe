"""Load the gpupool chart's settings (its ConfigMap `gpupool-config`, mounted into the z2jh hub)
into the hub's traitlets config. The chart renders them as traitlets config already — a JSON
object keyed by configurable class and trait name (GPUPool, GPUKubeSpawner, TrainPool,
KubeSpawner), the z2jh way — so nothing is translated here: the file is read by traitlets' JSON
config loader and merged. In z2jh's hub.extraConfig::

    from gpupool.kube.chart_config import load_chart_config
    load_chart_config(c, "/etc/gpupool/hub-config.json")
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import JSONFileConfigLoader

# the file in the ConfigMap
CONFIG_FILE = "hub-config.json"


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
