"""LIBERTy benchmarks (Toker et al. 2026): texts generated from a structural causal model, with exact
structural counterfactuals (``dataset=liberty``).

**Generated** (the default): ``n_explained + n_test + n_explainer`` units are sampled from the SCM
(:mod:`cprobe.data.scm`, ``dataset.scm``), each unit's exogenous values stored — the equations' noise, and the text
noise of the realiser (:mod:`cprobe.data.realiser`: template, persona, sentence order, phrase variants). The splits
follow the paper's Table 6:

- ``train``: D_f (1.5K), the explained model's training texts;
- ``test``: the counterfactuals' base texts, ``n_test`` of them (Table 6's "D_c⃗" column counts them with their
  counterfactuals: 1,332 − 998 = 334 for CV, 1,243 − 932 = 311 for Disease, 1,756 − 1,317 = 439 for Violence);
  with ``n_test: null`` a ``test_share`` of D_f is held out instead;
- ``explainer``: D_M (0.5K), what explainers fit on and the candidate pool of the matching explainers;
- ``pairs``: for every test text, ``changes`` (3) distinct concepts picked at random, each set to a random other
  value: abduction (the unit's noise) – action (do(C = c′)) – prediction (the descendants re-solved, the text
  re-realised with the same text noise). The label is never intervened on. 334 / 311 / 439 test texts give
  1,002 / 933 / 1,317 pairs; the paper has 998 / 932 / 1,317 (it does not say why 4 and 1 are missing).

**Loaded** (``dataset.texts=<file>``, e.g. LLM-written texts such as the released benchmark): a CSV or JSONL file
with columns ``id``, ``text``, ``split`` (train | test | explainer | counterfactual), one column per SCM variable
(value name or index), and for counterfactual rows ``base_id`` (a test text) and ``intervened`` (the concept
changed). Checked against the SCM: known values, the intervened concept differs from the base's, and only the
intervened concept and its descendants differ.

Every text is a :class:`~cprobe.data.items.TextItem` (``concepts`` = the non-label variables' value names,
``outcome`` = the label's value name, ``meta`` = unit id and stored noise); every pair a
:class:`~cprobe.data.items.CounterfactualPair` with one intervened concept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cprobe.data.items import CounterfactualPair, TextItem
from cprobe.data.scm import SCM, Noise
from cprobe.errors import ConfigError, DataError

SPLITS = ("train", "test", "explainer")


@dataclass(frozen=True)
class LibertyKeys:
    """The ``dataset`` node of ``dataset=liberty``."""

    scm: str = "cv"  # conf/scm/<name>.yaml (cv | violence | disease) or a path to your own SCM file
    realiser: str = "template"  # the text node (registered realisers: cprobe.data.realiser)
    n_explained: int = 1500  # D_f: the explained model's training texts (with n_test: null, train + test)
    n_test: int | None = None  # test texts (the counterfactuals' bases), drawn beside D_f; null: test_share of D_f
    test_share: float = 0.2  # with n_test: null, the share of D_f held out as test texts
    n_explainer: int = 500  # D_M: the explainers' training texts / matching pool
    changes: int = 3  # concept changes per test text
    texts: str | None = None  # a file of your own generated texts (CSV / JSONL; see the module doc)
    seed: int = 0  # the generation seed (the same benchmark for every job seed)

    def __post_init__(self) -> None:
        if self.n_explained < 10 or self.n_explainer < 10:
            raise ConfigError(f"dataset.n_explained and dataset.n_explainer must be >= 10, got {self.n_explained}, "
                              f"{self.n_explainer}")
        if not 0 < self.test_share < 1:
            raise ConfigError(f"dataset.test_share must lie in (0, 1), got {self.test_share}")
        if self.changes < 1:
            raise ConfigError(f"dataset.changes must be >= 1, got {self.changes}")
        if self.n_test is not None and self.n_test < 1:
            raise ConfigError(f"dataset.n_test must be >= 1 (or null: test_share of n_explained), got {self.n_test}")
        if self.n_test is None and self.n_explained - max(1, round(self.test_share * self.n_explained)) < 1:
            raise ConfigError(f"dataset.test_share={self.test_share} leaves no training text of n_explained="
                              f"{self.n_explained}")


@dataclass(frozen=True)
class LibertyData:
    name: str
    source: str
    scm: SCM
    splits: dict[str, tuple[TextItem, ...]]
    pairs: tuple[CounterfactualPair, ...]
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return sum(len(v) for v in self.splits.values())

    def subsample(self, n: int, seed: int = 0) -> LibertyData:
        """The explained model's training split cut to ``n`` texts (``dataset.max_examples``)."""
        train = self.splits["train"]
        if len(train) <= n:
            return self
        keep = sorted(np.random.default_rng(seed).choice(len(train), n, replace=False).tolist())
        return LibertyData(self.name, self.source, self.scm, {**self.splits, "train": tuple(train[i] for i in keep)},
                           self.pairs, (*self.notes, f"training split subsampled to {n} of {len(train)} texts"))


def load_liberty(cfg: LibertyKeys, root: Path, name: str) -> LibertyData:
    scm = SCM.load(cfg.scm)
    if cfg.texts:
        path = Path(cfg.texts).expanduser()
        if not path.is_absolute() and not path.exists():
            path = Path(root) / path
        return load_texts(scm, path, name)
    return generate(scm, cfg, name, cfg.seed)


# ---------------------------------------------------------------------- generation
def generate(scm: SCM, cfg: LibertyKeys, name: str = "liberty", seed: int = 0) -> LibertyData:
    from cprobe.data.realiser import build_realiser

    realiser = build_realiser(cfg.realiser, scm)
    n_f = cfg.n_explained + (cfg.n_test or 0)  # D_f and, with n_test, the test texts after it
    n = n_f + cfg.n_explainer
    rng = np.random.default_rng([seed, 0])
    values, noise = scm.sample(n, rng)
    text_noise = realiser.draw(n, np.random.default_rng([seed, 1]))
    units = [_item(scm, realiser, f"{scm.name}-{i:05d}", values, noise, text_noise[i], i) for i in range(n)]
    n_test = cfg.n_test or max(1, round(cfg.test_share * cfg.n_explained))
    splits = {"train": tuple(units[: n_f - n_test]), "test": tuple(units[n_f - n_test: n_f]),
              "explainer": tuple(units[n_f:])}
    pairs = counterfactual_pairs(scm, realiser, splits["test"], cfg.changes, seed)
    return LibertyData(name, f"generated from SCM {scm.name} ({scm.digest}) with the {realiser.name} realiser, "
                       f"seed {seed}", scm, splits, pairs)


def _item(scm: SCM, realiser: Any, uid: str, values: dict[str, np.ndarray], noise: Noise, tnoise: dict, i: int,
          do: dict[str, str] | None = None, unit: str | None = None) -> TextItem:
    named = {k: scm.variables[k].values[int(values[k][i])] for k in scm.variables}
    meta = {"unit": unit or uid, "noise": noise.row(i), "text_noise": tnoise}
    if do:
        meta["do"] = do
    return TextItem(uid, realiser.realise(named, tnoise), {k: named[k] for k in scm.concepts}, named[scm.label],
                    meta=meta)


def counterfactual_pairs(scm: SCM, realiser: Any, bases: Sequence[TextItem], changes: int,
                         seed: int = 0) -> tuple[CounterfactualPair, ...]:
    """``changes`` random concept changes per base, each a structural counterfactual (same noise, same text
    noise, do(C = c′), descendants re-solved)."""
    rng = np.random.default_rng([seed, 2])
    concepts = list(scm.concepts)
    out = []
    for base in bases:
        noise = Noise.from_rows([base.meta["noise"]])
        for c in rng.choice(len(concepts), size=min(changes, len(concepts)), replace=False):
            concept = concepts[int(c)]
            var = scm.variables[concept]
            others = [v for v in var.values if v != base.concepts[concept]]
            value = others[int(rng.integers(len(others)))]
            cf = scm.counterfactual(noise, {concept: value})
            item = _item(scm, realiser, f"{base.id}~do({concept}={value})", cf, noise, base.meta["text_noise"], 0,
                         do={concept: value}, unit=base.meta["unit"])
            out.append(CounterfactualPair(f"{base.id}|{concept}", base, item, (concept,)))
    return tuple(out)


# ---------------------------------------------------------------------- a user's own texts
def load_texts(scm: SCM, path: Path, name: str) -> LibertyData:
    """Texts generated elsewhere (see the module doc), validated against the SCM."""
    import pandas as pd

    if not path.is_file():
        raise DataError(f"LIBERTy texts file {path} does not exist (dataset.texts)")
    if not path.read_bytes().strip():
        raise DataError(f"LIBERTy texts file {path} is empty (dataset.texts); it needs a row per text with columns "
                        f"id, text, split and one per SCM variable ({list(scm.variables)})")
    try:  # every cell as text: ids stay ids ("32", not 32.0), a value named "1" stays that name
        if path.suffix in (".jsonl", ".json"):
            records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            frame = pd.DataFrame.from_records(records).astype(object)
            frame = frame.where(frame.notna(), "").map(lambda x: x if isinstance(x, str) else _text(x))
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise DataError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    need = ["id", "text", "split", *scm.variables]
    if frame.empty and set(need) <= set(frame.columns):
        raise DataError(f"LIBERTy texts file {path} has a header but no rows (dataset.texts)")
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise DataError(f"{path.name}: missing column(s) {missing}; need id, text, split, one column per SCM variable "
                        f"({list(scm.variables)}), and base_id, intervened for counterfactual rows")
    if frame["id"].duplicated().any():
        raise DataError(f"{path.name}: duplicated id {frame['id'][frame['id'].duplicated()].iloc[0]!r}")
    bad = sorted(set(frame["split"]) - {*SPLITS, "counterfactual"})
    if bad:
        raise DataError(f"{path.name}: unknown split(s) {bad}; choose from {[*SPLITS, 'counterfactual']}")
    items: dict[str, TextItem] = {}
    for r in frame.to_dict("records"):
        named = {}
        for k, var in scm.variables.items():
            try:
                named[k] = var.values[var.index(r[k], f"{path.name}, row {r['id']}: ")]
            except ConfigError as e:
                raise DataError(str(e)) from None
        if not r["text"].strip():
            raise DataError(f"{path.name}, row {r['id']}: empty text")
        items[r["id"]] = TextItem(r["id"], r["text"], {k: named[k] for k in scm.concepts}, named[scm.label],
                                  meta={"unit": r["id"], "split": r["split"]})
    splits = {s: tuple(items[i] for i in frame["id"][frame["split"] == s]) for s in SPLITS}
    for s in SPLITS:
        if not splits[s]:
            raise DataError(f"{path.name}: no rows in split {s!r}")
    cf = frame[frame["split"] == "counterfactual"]
    for col in ("base_id", "intervened"):
        if len(cf) and col not in cf.columns:
            raise DataError(f"{path.name}: counterfactual rows need a {col!r} column")
    test_ids = {it.id for it in splits["test"]}
    pairs = []
    for r in cf.to_dict("records"):
        base_id, concept = str(r["base_id"]), str(r["intervened"])
        if base_id not in items and base_id.endswith(".0") and base_id[:-2] in items:
            base_id = base_id[:-2]  # an integer id written from a float column (pandas: 32 → "32.0")
        where = f"{path.name}, counterfactual {r['id']}"
        if base_id not in test_ids:
            raise DataError(f"{where}: base_id {base_id!r} is not a test text")
        if concept not in scm.concepts:
            raise DataError(f"{where}: intervened {concept!r} is not a concept; choose from {list(scm.concepts)}")
        base, source = items[base_id], items[r["id"]]
        if base.concepts[concept] == source.concepts[concept]:
            raise DataError(f"{where}: {concept} has the base's value {base.concepts[concept]!r}; nothing changed")
        allowed = {concept, *scm.descendants(concept)}
        moved = [k for k in scm.variables if k not in allowed and _value(base, scm, k) != _value(source, scm, k)]
        if moved:
            raise DataError(f"{where}: {moved} changed although not descendants of the intervened {concept!r} (a "
                            "structural counterfactual keeps everything else)")
        pairs.append(CounterfactualPair(f"{base_id}|{concept}", base, source, (concept,)))
    if not pairs:
        raise DataError(f"{path.name}: no counterfactual rows (split=counterfactual with base_id and intervened)")
    return LibertyData(name, str(path), scm, splits, tuple(pairs))


def _text(x: Any) -> str:
    """A JSON scalar as text (an integral float as an integer: 32.0 → "32")."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _value(item: TextItem, scm: SCM, key: str) -> str:
    return item.outcome if key == scm.label else item.concepts[key]
