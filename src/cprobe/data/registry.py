"""Dataset config -> :class:`Dataset` (the ``dataset`` config group).

Every dataset type declares the keys its config may hold (a dataclass, parsed with unknown keys rejected);
:func:`load_dataset` then applies the checks every dataset gets: unique ids, no item whose correct and wrong
forms are identical, duplicated sentences dropped or rejected (``duplicates: drop|error`` — a duplicate would
sit in two splits), and the seeded stratified ``max_examples`` subsample.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cprobe.config import parse
from cprobe.data.base import Dataset, Example
from cprobe.data.causalgym_corpus import template_corpus
from cprobe.data.cebab import CebabKeys, load_cebab
from cprobe.data.fact_world import FactWorldKeys, generate_world
from cprobe.data.generic import GenericConfig, load_generic
from cprobe.data.grammar import PROPERTIES, GrammarConfig, generate
from cprobe.data.lama import FactData, LamaKeys, load_lama
from cprobe.data.lgd import load_lgd
from cprobe.data.liberty import LibertyKeys, load_liberty
from cprobe.data.marvin_linzen import TASKS, load_marvin_linzen
from cprobe.data.mib import corpus as mib_corpus
from cprobe.data.ravel import RavelKeys, load_ravel
from cprobe.errors import ConfigError, DataError
from cprobe.registry import Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetCommon:
    """Keys every dataset config may hold."""

    name: str = "dataset"
    type: str | None = None
    max_examples: int | None = None
    stratify: str | None = "z_c"
    seed: int = 0
    duplicates: Literal["error", "drop"] | None = None  # None: the type's default (error; drop for generated data)


@dataclass(frozen=True)
class DatasetType:
    loader: Callable[[Any, Path, str], Dataset]
    config: type  # the type-specific keys (a dataclass)
    properties: Callable[[Any], tuple[str, ...]] | None = None  # the properties its items carry, from its config
    duplicates: str = "error"  # what a repeated sentence is when the config does not say: generators repeat by chance
    twins: Callable[[Any, Path, str, str], Dataset] | None = None  # minimal-pair twins (see :func:`minimal_pairs`)
    flippable: tuple[str, ...] = ()  # the properties ``twins`` can flip


def _accept(obj: Any, ref: str) -> DatasetType:
    """An outside dataset: a :class:`DatasetType` as the built-ins register, or a dataset class
    (:class:`cprobe.data.base.DatasetSource`, or any class with ``load(root, name)``) whose constructor's keyword
    arguments are its config keys."""
    import inspect

    if isinstance(obj, DatasetType):
        return obj
    if not (inspect.isclass(obj) and callable(getattr(obj, "load", None))):
        from cprobe.registry import wrong_family

        raise wrong_family(obj, ref, "dataset type", "DatasetSource")
    return source_type(obj, ref)


def source_type(cls: type, ref: str) -> DatasetType:
    """The :class:`DatasetType` of a dataset class: its config dataclass read from the constructor's signature
    (annotations and defaults; the common keys ``name``, ``type``, ``max_examples``, ... stay the common ones)."""
    import dataclasses
    import inspect

    import typing

    common = {f.name for f in fields(DatasetCommon)}
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: the values are not type-checked
        hints = {}
    specs = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in common:
            raise ConfigError(f"dataset class {ref!r}: constructor argument {p.name!r} is a key every dataset has "
                              f"({sorted(common)}); rename it")
        tp = hints.get(p.name, Any)
        if p.default is p.empty:
            specs.append((p.name, tp, dataclasses.field(default=None)))
        else:
            default = p.default
            specs.append((p.name, tp, dataclasses.field(default_factory=lambda d=default: d)))
    keys = dataclasses.make_dataclass(f"{cls.__name__}Keys", specs, frozen=True)

    def build(specific: Any) -> Any:
        try:
            return cls(**{f.name: getattr(specific, f.name) for f in fields(specific)})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"dataset {ref!r}: {e}") from None

    def loader(specific: Any, root: Path, name: str) -> Dataset:
        ds = build(specific).load(root, name)
        if not isinstance(ds, Dataset):
            raise DataError(f"dataset {ref!r}: load() returned {type(ds).__name__}, not a cprobe Dataset")
        return ds

    def properties(specific: Any) -> tuple[str, ...] | None:
        declared = getattr(cls, "properties", None)
        if callable(declared):
            declared = build(specific).properties()
        return None if declared is None else tuple(declared)

    twins = None
    if callable(getattr(cls, "twins", None)):
        def twins(specific: Any, root: Path, name: str, prop: str) -> Dataset:
            return build(specific).twins(root, name, prop)
    return DatasetType(loader, keys, properties, str(getattr(cls, "duplicates", "error")), twins,
                       tuple(getattr(cls, "flippable", ())))


DATASETS: Registry[DatasetType] = Registry("dataset type", group="cprobe.datasets", accept=_accept)


def register(name: str, config: type, properties: Callable[[Any], tuple[str, ...]] | None = None,
             duplicates: str = "error", twins: Callable[[Any, Path, str, str], Dataset] | None = None,
             flippable: tuple[str, ...] = ()):
    """Register a loader; ``properties(type-specific keys)`` declares the properties its items will carry, so a
    config naming another property is rejected before any data is read; ``duplicates`` is the default of
    ``dataset.duplicates`` for the type; ``twins`` emits each item's minimal-pair twin with one of the ``flippable``
    properties flipped (:func:`minimal_pairs`)."""
    def deco(fn: Callable[[Any, Path, str], Dataset]) -> Callable[[Any, Path, str], Dataset]:
        DATASETS.register(name)(DatasetType(fn, config, properties, duplicates, twins, flippable))
        return fn
    return deco


def declared_properties(cfg: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The properties the dataset of config ``cfg`` declares (None: known only once loaded)."""
    _, dtype, specific = split_config(cfg)
    return dtype.properties(specific) if dtype.properties is not None else None


def check_properties(cfg: Mapping[str, Any], wanted: Sequence[str], where: str) -> None:
    """ConfigError when a property in ``wanted`` (the setting ``where``) is not one the dataset declares."""
    have = declared_properties(cfg)
    if have is None:
        return
    unknown = [p for p in wanted if p not in have]
    if unknown:
        raise ConfigError(f"{where}: unknown propert{'y' if len(unknown) == 1 else 'ies'} {unknown} for dataset "
                          f"{cfg.get('name')!r}; it has {list(have)}")


CORPORA: Registry[Callable[[Mapping[str, Any], Path], list[str]]] = Registry("tiny-model corpus")
"""Sentence sources a ``model.tiny`` node may name (``tiny.<name>: {...}``): ``source(spec, data_root)`` returns
sentences that join the model's training corpus, generated when the model is built (:func:`with_corpora`)."""


CORPORA.register("causalgym_corpus", template_corpus)
CORPORA.register("mib_corpus", mib_corpus)


def with_corpora(tiny: Mapping[str, Any], data_root: Path) -> dict[str, Any]:
    """A copy of a ``model.tiny`` node with every registered corpus it names expanded into ``extra_sentences``."""
    t = dict(tiny)
    for name in [k for k in t if k in CORPORA.names()]:
        spec = t.pop(name)
        if spec:
            t["extra_sentences"] = [*t.get("extra_sentences", ()), *CORPORA.get(name)(dict(spec), data_root)]
    return t


def grammar_config(d: Mapping[str, Any] | None):
    """``GrammarConfig`` from a config mapping (YAML lists become the tuples it hashes)."""
    d = dict(d or {})
    if "structures" in d:
        d["structures"] = tuple(tuple(s) for s in d["structures"])
    try:
        return GrammarConfig(**d)
    except TypeError as e:
        raise ConfigError(f"bad grammar config: {e}") from None


@dataclass(frozen=True)
class SyntheticKeys:
    grammar: dict = field(default_factory=dict)


def _synthetic_twins(cfg: SyntheticKeys, _root: Path, name: str, prop: str) -> Dataset:
    return replace(generate(grammar_config(cfg.grammar), flip=prop), name=name, source="built-in (cprobe.data.grammar)")


@register("synthetic", SyntheticKeys, lambda _cfg: tuple(PROPERTIES), duplicates="drop",  # the grammar repeats a few by chance
          twins=_synthetic_twins, flippable=("z_c",))
def _synthetic(cfg: SyntheticKeys, _root: Path, name: str) -> Dataset:
    return replace(generate(grammar_config(cfg.grammar)), name=name, source="built-in (cprobe.data.grammar)")


@dataclass(frozen=True)
class FileKeys:
    path: str = ""


@register("lgd", FileKeys, lambda _cfg: ("z_c", "z_e", "n_attractors"))
def _lgd(cfg: FileKeys, root: Path, name: str) -> Dataset:
    return load_lgd(root / (cfg.path or "lgd_agreement/lgd_subset.tsv"), name)


@dataclass(frozen=True)
class MarvinLinzenKeys:
    path: str = "marvin_linzen"
    tasks: list[str] | None = None


@register("marvin_linzen", MarvinLinzenKeys, lambda _cfg: ("z_c", "z_e", "n_attractors", "task"))
def _ml(cfg: MarvinLinzenKeys, root: Path, name: str) -> Dataset:
    return load_marvin_linzen(root / cfg.path, tuple(cfg.tasks or TASKS), name)


@register("generic", GenericConfig, lambda cfg: tuple(cfg.properties))
def _generic(cfg: GenericConfig, root: Path, name: str) -> Dataset:
    if not cfg.path:
        raise ConfigError("generic dataset: set dataset.path to your TSV/CSV/JSONL file (see conf/dataset/generic.yaml)")
    path = Path(cfg.path).expanduser()
    if not path.is_absolute() and not path.exists():
        path = root / path  # relative: the current directory first, then the data dir
    return load_generic(path, cfg, name)


@dataclass(frozen=True)
class CombinedKeys:
    parts: list[dict] = field(default_factory=list)


def _combined_properties(cfg: Any) -> tuple[str, ...] | None:
    parts = [declared_properties(p) for p in cfg.parts]
    return None if any(p is None for p in parts) else tuple(dict.fromkeys(x for p in parts for x in p))  # type: ignore[union-attr]


@register("combined", CombinedKeys, _combined_properties)
def _combined(cfg: CombinedKeys, root: Path, name: str) -> Dataset:
    parts = [load_dataset(p, root) for p in cfg.parts]
    if not parts:
        raise ConfigError("combined dataset: list its parts under dataset.parts")
    props = tuple(dict.fromkeys(p for d in parts for p in d.properties))
    return Dataset(name, tuple(e for d in parts for e in d.examples), props,
                  source=" + ".join(d.source for d in parts), notes=tuple(n for d in parts for n in d.notes))


register("cebab", CebabKeys)(load_cebab)  # type: ignore[arg-type]  # the text studies' data, not a Dataset
register("liberty", LibertyKeys)(load_liberty)  # type: ignore[arg-type]
register("lama", LamaKeys)(load_lama)  # type: ignore[arg-type]
register("ravel", RavelKeys)(load_ravel)  # type: ignore[arg-type]


@register("fact_world", FactWorldKeys)
def _fact_world(cfg: FactWorldKeys, _root: Path, name: str) -> FactData:
    return generate_world(cfg, name)


def split_config(cfg: Mapping[str, Any]) -> tuple[DatasetCommon, DatasetType, Any]:
    """Validate a dataset config node: (common keys, the type, its type-specific keys)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"dataset must be a config mapping, got {cfg!r}")
    kind = cfg.get("type", cfg.get("name"))
    if kind is None:
        raise ConfigError("dataset=custom needs dataset.type=NAME_OR_IMPORT_PATH (a plugin's dataset, or "
                          "package.module:Class)")
    dtype = DATASETS.get(str(kind))
    common_names = {f.name for f in fields(DatasetCommon)}
    specific_names = {f.name for f in fields(dtype.config)}
    unknown = sorted(set(cfg) - common_names - specific_names)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for dataset type {kind!r}; known keys: "
                          f"{sorted(common_names | specific_names)}")
    common = parse(DatasetCommon, {k: v for k, v in cfg.items() if k in common_names}, "dataset")
    specific = parse(dtype.config, {k: v for k, v in cfg.items() if k in specific_names}, "dataset")
    if common.max_examples is not None and common.max_examples < 1:
        raise ConfigError(f"dataset.max_examples must be >= 1 (or null for all), got {common.max_examples}")
    return common, dtype, specific


def pairs_refusal(cfg: Mapping[str, Any], prop: str) -> str | None:
    """Why the dataset ``cfg`` cannot emit minimal pairs that flip ``prop`` (None when it can); no data is read."""
    _, dtype, _ = split_config(cfg)
    if dtype.twins is None:
        kinds = sorted(n for n in DATASETS.names() if DATASETS.get(n).twins is not None)
        return (f"dataset {cfg.get('name')!r} (type {cfg.get('type', cfg.get('name'))!r}) cannot emit minimal pairs; "
                f"dataset types that can: {kinds}")
    if prop not in dtype.flippable:
        return f"dataset {cfg.get('name')!r} can emit minimal pairs flipping {list(dtype.flippable)}, not {prop!r}"
    return None


def minimal_pairs(cfg: Mapping[str, Any], root: Path, prop: str, examples: Sequence[Example]) -> list[Example]:
    """The minimal-pair twin of each of ``examples`` (items of the dataset ``cfg`` loads): the same input with only
    ``prop`` flipped, matched by id — the sources of a causal direction's interchange training (DAS). A dataset type
    declares ``twins`` to emit them (the synthetic grammar: :func:`cprobe.data.grammar.generate` with ``flip``)."""
    why = pairs_refusal(cfg, prop)
    if why:
        raise ConfigError(why)
    common, dtype, specific = split_config(cfg)
    twins = {e.id: e for e in dtype.twins(specific, Path(root), common.name, prop).examples}
    missing = [e.id for e in examples if e.id not in twins]
    if missing:
        raise DataError(f"no minimal-pair twin for {len(missing)} item(s), e.g. {missing[0]!r}")
    out = [twins[e.id] for e in examples]
    bad = [e.id for e, t in zip(examples, out) if e.props.get(prop) == t.props.get(prop)]
    if bad:
        raise DataError(f"minimal-pair twin of {bad[0]!r} does not flip {prop!r}")
    return out


def load_dataset(cfg: Mapping[str, Any], root: Path) -> Dataset:
    """Load, check, de-duplicate, then optionally subsample to ``max_examples`` (stratified, seeded)."""
    common, dtype, specific = split_config(cfg)
    ds = dtype.loader(specific, Path(root), common.name)
    ds = replace(ds, source=relative_source(ds.source, Path(root)))
    # max_examples >= 1 where set (split_config checked it)
    if not isinstance(ds, Dataset):  # another item family (e.g. CEBaB's TextItem splits): checked by its loader
        return ds if common.max_examples is None else ds.subsample(common.max_examples, common.seed)
    ds = check_items(ds, common.duplicates or dtype.duplicates)
    if common.max_examples is not None and len(ds) > common.max_examples:
        ds = ds.subset(sorted(stratified_sample(ds, common.max_examples, common.stratify, common.seed)))
    return ds


def check_items(ds: Dataset, duplicates: str = "error") -> Dataset:
    """Unique ids; correct != wrong; duplicated sentences (same words and slot) dropped or rejected."""
    ids = Counter(e.id for e in ds.examples)
    dup_ids = [i for i, c in ids.items() if c > 1]
    if dup_ids:
        raise DataError(f"dataset {ds.name!r} ({ds.source}): {len(dup_ids)} duplicated id(s), e.g. {dup_ids[0]!r}; "
                        "ids must be unique")
    same = [e.id for e in ds.examples if e.correct == e.wrong]
    if same:
        raise DataError(f"dataset {ds.name!r} ({ds.source}): {len(same)} item(s) whose correct and wrong forms are "
                        f"identical, e.g. {same[0]!r}")
    seen: dict[tuple, int] = {}
    keep, dups = [], []
    for i, e in enumerate(ds.examples):
        key = (e.words, e.target)
        if key in seen:
            first = ds.examples[seen[key]]
            if (first.correct, first.wrong, dict(first.props)) != (e.correct, e.wrong, dict(e.props)):
                raise DataError(f"dataset {ds.name!r}: items {first.id!r} and {e.id!r} are the same sentence with "
                                "different labels or verb forms; fix the data")
            dups.append(e.id)
            continue
        seen[key] = i
        keep.append(i)
    if not dups:
        return ds
    if duplicates == "error":
        raise DataError(f"dataset {ds.name!r} ({ds.source}): {len(dups)} duplicated sentence(s), e.g. {dups[0]!r}; a "
                        "duplicate would sit in two splits. Remove them, or set dataset.duplicates=drop")
    # recorded, not logged: whoever reads the dataset reports its notes once (a job: JobContext.warn)
    return ds.subset(keep).with_notes(f"dropped {len(dups)} duplicated sentence(s) of {ds.name} (kept the first of each)")


def relative_source(source: str, root: Path) -> str:
    """A file under the data dir as a path relative to it (stable across machines); others unchanged."""
    try:
        return str(Path(source).resolve().relative_to(root.resolve()))
    except (ValueError, OSError):
        return source


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
