"""Splits: disjoint, stratified, seeded; the oracle split made independent of a second property."""

from __future__ import annotations

import numpy as np
import pytest

from cprobe.data.base import Dataset, Example
from cprobe.data.splits import decorrelate, make_splits, split_indices
from cprobe.errors import ConfigError


def _ds(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    ex = []
    for i in range(n):
        zc = "sg" if rng.random() < 0.5 else "pl"
        # z_e correlated with z_c: equal 80% of the time
        ze = zc if rng.random() < 0.8 else ("pl" if zc == "sg" else "sg")
        ex.append(Example(str(i), ("x",), 0, "a", "b", {"z_c": zc, "z_e": ze if i % 5 else "none"}))
    return Dataset("d", tuple(ex), ("z_c", "z_e"))


def test_split_fractions_disjoint_stratified_seeded():
    ds = _ds()
    s = split_indices(ds, {"oracle": 0.4, "intervention": 0.4, "test": 0.2}, "z_c", seed=1)
    all_idx = np.concatenate(list(s.values()))
    assert len(all_idx) == len(ds) == len(set(all_idx.tolist()))
    assert abs(len(s["test"]) - 200) <= 2
    share = lambda idx: np.mean([ds.examples[i].props["z_c"] == "sg" for i in idx])  # noqa: E731
    assert abs(share(s["test"]) - share(np.arange(len(ds)))) < 0.02
    s2 = split_indices(ds, {"oracle": 0.4, "intervention": 0.4, "test": 0.2}, "z_c", seed=1)
    assert all((s[k] == s2[k]).all() for k in s)


def test_decorrelate_makes_properties_independent():
    ds = _ds()
    idx = np.arange(len(ds))
    prior = np.mean([e.props["z_c"] == "sg" for e in ds.examples])
    kept = decorrelate(ds, idx, "z_c", "z_e", seed=0)
    zc = np.array([ds.examples[i].props["z_c"] for i in kept])
    ze = np.array([ds.examples[i].props["z_e"] for i in kept])
    for v in np.unique(ze):
        assert (zc[ze == v] == "sg").mean() == pytest.approx(prior, abs=0.01)  # P(z_c | z_e) = P(z_c)
    assert len(kept) > 300


def _cells(spec: dict[tuple[str, str], int]) -> Dataset:
    ex = [Example(f"{zc}{ze}{i}", ("x",), 0, "a", "b", {"z_c": zc, "z_e": ze})
          for (zc, ze), n in spec.items() for i in range(n)]
    return Dataset("cells", tuple(ex), ("z_c", "z_e"))


def test_decorrelate_keeps_the_prior_hand_computed():
    """z_e = a: 6 sg + 2 pl; z_e = b: 2 sg + 2 pl. Prior P(sg) = 8/12 = 2/3. Largest subsample with
    P(sg | z_e) = 2/3: a keeps min(6/(2/3), 2/(1/3)) = 6 rows (4 sg, 2 pl), b keeps min(3, 6) = 3 (2 sg, 1 pl).
    Balancing (the old behaviour) would keep 2 + 2 per value: P(sg) 0.5, the prior lost."""
    ds = _cells({("sg", "a"): 6, ("pl", "a"): 2, ("sg", "b"): 2, ("pl", "b"): 2})
    kept = decorrelate(ds, np.arange(len(ds)), "z_c", "z_e", seed=0)
    counts = {}
    for i in kept:
        p = ds.examples[i].props
        counts[(p["z_c"], p["z_e"])] = counts.get((p["z_c"], p["z_e"]), 0) + 1
    assert counts == {("sg", "a"): 4, ("pl", "a"): 2, ("sg", "b"): 2, ("pl", "b"): 1}


@pytest.mark.parametrize("fractions", [{"a": 0.5, "b": 0.6}, {"a": 0.0, "b": 1.0}, {}])
def test_bad_fractions(fractions):
    with pytest.raises(ConfigError):
        split_indices(_ds(50), fractions, None, 0)


def test_make_splits_independent_spec():
    spec = {"fractions": {"oracle": 0.4, "intervention": 0.4, "test": 0.2}, "stratify": "z_c",
            "independent": {"oracle": ["z_c", "z_e"]}}
    s = make_splits(_ds(), spec, 0)
    assert len(s["oracle"]) < 400
    with pytest.raises(ConfigError, match="not among"):
        make_splits(_ds(), {**spec, "independent": {"nope": ["z_c", "z_e"]}}, 0)
