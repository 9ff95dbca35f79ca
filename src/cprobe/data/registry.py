"""Dataset config -> :class:`Dataset` (the ``dataset`` config group)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cprobe.data.base import Dataset
from cprobe.errors import ConfigError
from cprobe.registry import Registry

Loader = Callable[[Mapping[str, Any], Path], Dataset]
DATASETS: Registry[Loader] = Registry("dataset type")


def grammar_config(d: Mapping[str, Any] | None):
    """``GrammarConfig`` from a config mapping (YAML lists become the tuples it hashes)."""
    from cprobe.data.grammar import GrammarConfig

    d = dict(d or {})
    if "structures" in d:
        d["structures"] = tuple(tuple(s) for s in d["structures"])
    try:
        return GrammarConfig(**d)
    except TypeError as e:
        raise ConfigError(f"bad grammar config: {e}") from None


@DATASETS.register("synthetic")
def _synthetic(cfg: Mapping[str, Any], _root: Path) -> Dataset:
    from cprobe.data.grammar import generate

    return generate(grammar_config(cfg.get("grammar")))


@DATASETS.register("lgd")
def _lgd(cfg: Mapping[str, Any], root: Path) -> Dataset:
    from cprobe.data.lgd import load_lgd

    return load_lgd(root / cfg.get("path", "lgd_agreement/lgd_subset.tsv"), cfg.get("name", "lgd"))


@DATASETS.register("marvin_linzen")
def _ml(cfg: Mapping[str, Any], root: Path) -> Dataset:
    from cprobe.data.marvin_linzen import TASKS, load_marvin_linzen

    return load_marvin_linzen(root / cfg.get("path", "marvin_linzen"), tuple(cfg.get("tasks") or TASKS),
                              cfg.get("name", "marvin_linzen"))


@DATASETS.register("generic")
def _generic(cfg: Mapping[str, Any], root: Path) -> Dataset:
    from cprobe.data.generic import load_generic

    if not cfg.get("path"):
        raise ConfigError("generic dataset: set dataset.path to your TSV/CSV/JSONL file")
    path = Path(cfg["path"]).expanduser()
    return load_generic(path if path.is_absolute() else root / path, cfg.get("columns", {}),
                        cfg.get("properties", {}), cfg.get("format", "auto"),
                        cfg.get("mask_marker", "***mask***"), cfg.get("name", "generic"))


@DATASETS.register("combined")
def _combined(cfg: Mapping[str, Any], root: Path) -> Dataset:
    parts = [load_dataset(p, root) for p in cfg.get("parts", [])]
    if not parts:
        raise ConfigError("combined dataset: list its parts under dataset.parts")
    props = tuple(dict.fromkeys(p for d in parts for p in d.properties))
    return Dataset(cfg.get("name", "combined"), tuple(e for d in parts for e in d.examples), props)


def load_dataset(cfg: Mapping[str, Any], root: Path) -> Dataset:
    """Load, then optionally subsample to ``max_examples`` (stratified by ``stratify``, seeded)."""
    ds = DATASETS.get(str(cfg.get("type", cfg.get("name"))))(cfg, root)
    limit = cfg.get("max_examples")
    if limit is not None and len(ds) > int(limit):
        ds = ds.subset(sorted(stratified_sample(ds, int(limit), cfg.get("stratify", "z_c"), int(cfg.get("seed", 0)))))
    return ds


def stratified_sample(ds: Dataset, n: int, prop: str | None, seed: int) -> list[int]:
    """``n`` indices keeping the proportions of ``prop``'s values (uniform sample if prop is None)."""
    rng = np.random.default_rng(seed)
    if prop is None or prop not in ds.properties:
        return rng.choice(len(ds), n, replace=False).tolist()
    keys = np.array([e.props.get(prop, "none") for e in ds.examples])
    out: list[int] = []
    values, counts = np.unique(keys, return_counts=True)
    quotas = np.floor(counts / counts.sum() * n).astype(int)
    quotas[: n - quotas.sum()] += 1
    for v, q in zip(values, quotas):
        idx = np.flatnonzero(keys == v)
        out += rng.choice(idx, min(q, len(idx)), replace=False).tolist()
    return out
