"""The substrate `backend=` names: `substrate_for(cfg)`. Each one is imported only when chosen, so
Ray is imported only for backend=ray (and a missing Ray is one line naming the key).

Not here: what a substrate is (`asyncrl.substrates`: `Substrate`, `RunData`, `Workers`).
"""

from __future__ import annotations

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.substrates import Substrate


def substrate_for(cfg: Config) -> Substrate:
    """The substrate `backend=` names; Ray is imported only when asked for."""
    if cfg.backend == "local":
        from asyncrl.substrates.local import LocalSubstrate

        return LocalSubstrate()
    if cfg.backend == "processes":
        from asyncrl.substrates.processes import ProcessSubstrate

        return ProcessSubstrate()
    if cfg.backend == "ray":
        from asyncrl.preflight import check_backend

        check_backend(cfg.backend)
        from asyncrl.substrates.ray_cluster import RaySubstrate

        return RaySubstrate()
    raise ConfigError(f"backend must be local, processes or ray, got {cfg.backend!r}")
