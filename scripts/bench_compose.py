"""Hydra composition: Hydra's own against cprobe's memos, in one process, on cprobe's config tree.

Composes each command `--n` times (after one untimed composition) with (a) Hydra as shipped, (b) every YAML text
parsed once (``cprobe._hydra.parse_configs_once``) and (c) that plus the defaults list and its merge kept per set of
config choices (``compose_defaults_once``, what ``cprobe run`` installs), and prints ms per composition and the
ratios. The points of a sweep differ in a value (``intervention.rank``), as the README's INLP sweep's do. It
exits non-zero if any variant composed a config different from Hydra's own.

    python scripts/bench_compose.py            # ~30 s
    python scripts/bench_compose.py --n 20
"""

from __future__ import annotations

import argparse
import time

from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl
from hydra._internal.core_plugins import file_config_source, importlib_resources_config_source
from omegaconf import OmegaConf

from cprobe import _hydra
from cprobe.paths import config_dir

COMMANDS = {
    "sweep point": ["+experiment=sva_tiny_reliability", "intervention=inlp", "intervention.rank={i}"],
    "probing run": ["+experiment=sva_tiny", "seed={i}"],
    "cebab smoke": ["+experiment=cebab", "+debug=smoke", "seed={i}"],
}


def _genuine() -> None:
    """Hydra as shipped, whatever was installed before."""
    loader = config_loader_impl.ConfigLoaderImpl
    config_loader_impl.create_defaults_list = getattr(config_loader_impl.create_defaults_list, "__wrapped__",
                                                      config_loader_impl.create_defaults_list)
    merge = loader._compose_config_from_defaults_list
    loader._compose_config_from_defaults_list = getattr(merge, "__wrapped__", merge)
    for module in (file_config_source, importlib_resources_config_source):
        module.OmegaConf = OmegaConf
    _hydra._PARSED.clear()
    _hydra._DEFAULTS.clear()


def _time(overrides: list[str], n: int) -> tuple[float, list[str]]:
    def one(i: int) -> str:
        cfg = compose("config", overrides=[o.format(i=i) for o in overrides], return_hydra_config=True)
        return OmegaConf.to_yaml(cfg)

    seen = [one(0)]
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        compose("config", overrides=[o.format(i=i) for o in overrides], return_hydra_config=True)
    ms = (time.perf_counter() - t0) / n * 1000
    return ms, seen + [one(n + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="timed compositions per command and variant")
    args = ap.parse_args()
    variants = {"hydra": lambda: None, "parse once": _hydra.parse_configs_once,
                "parse + merge once": lambda: (_hydra.parse_configs_once(), _hydra.compose_defaults_once())}
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        rows = {}
        for name, install in variants.items():
            _genuine()
            install()
            for label, overrides in COMMANDS.items():
                rows[name, label] = _time(overrides, args.n)
    print(f"{'command':<14} {'hydra ms':>9} {'parse once':>11} {'+ merge once':>13} {'speed-up':>9}")
    for label in COMMANDS:
        base, parsed, both = (rows[v, label] for v in variants)
        if not (base[1] == parsed[1] == both[1]):
            raise SystemExit(f"{label}: the variants composed different configs")
        print(f"{label:<14} {base[0]:9.1f} {parsed[0]:11.1f} {both[0]:13.1f} {base[0] / both[0]:8.1f}x")


if __name__ == "__main__":
    main()
