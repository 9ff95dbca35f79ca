"""Values that one-line changes move (issue 30): each test pins a hand-computed number that a named mutant of the
bridges changes — k > 2 counterfactual directions, NaN items in the bootstrap, the mean over seeds, the items a
record counts. (The engine's own mutants — erasure's clean/edited order, read layers l′ ≠ l — are pinned in
tests/integration/test_fidelity_causalgym.py and test_fidelity_read_layers.py.)"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe import records as R
from cprobe.interventions import INTERVENTIONS
from cprobe.leaderboard import CI_TEXT, interval, leaderboard

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

S6 = math.sqrt(6.0)


def _three_classes() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows at each of 3e₁, 3e₂, 3e₃ (classes 0, 1, 2)."""
    X = torch.tensor([[3.0, 0, 0], [3, 0, 0], [0, 3, 0], [0, 3, 0], [0, 0, 3], [0, 0, 3]], dtype=torch.float64)
    return X, torch.tensor([0, 0, 1, 1, 2, 2])


def test_k3_counterfactual_moves_each_row_along_its_targets_own_direction_hand_computed():
    """Class c against the rest: μ_c − μ_rest = 3e_c − 1.5(1 − e_c), so a_c = (3e_c − 1.5·Σ_{j≠c} e_j)/(1.5√6): for
    c = 0, a₀ = (2, −1, −1)/√6, and the target t₀ = a₀ᵀ(3e₁) = √6. Row x = 3e₂ (class 1) to z′ = 0:
    x′ = x + (t₀ − a₀ᵀx) a₀ = (0, 3, 0) + (√6 + 3/√6)(2, −1, −1)/√6 = (3, 1.5, −1.5); to z′ = 2 along
    a₂ = (−1, −1, 2)/√6 with t₂ = √6: (0, 3, 0) + 1.5 (−1, −1, 2) = (−1.5, 1.5, 3). One direction (class 0's) for every
    target would give (3, 1.5, −1.5) for both."""
    X, z = _three_classes()
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    assert m.targets_.tolist() == pytest.approx([S6, S6, S6])
    torch.testing.assert_close(m.A.double(), torch.tensor([[2.0, -1, -1], [-1, 2, -1], [-1, -1, 2]],
                                                          dtype=torch.float64) / S6, atol=1e-6, rtol=0)
    x = torch.tensor([[0.0, 3, 0], [0, 3, 0], [3, 0, 0]], dtype=torch.float64)
    out = m.transform(x, torch.tensor([0, 2, 1]))
    want = torch.tensor([[3.0, 1.5, -1.5], [-1.5, 1.5, 3.0], [1.5, 3.0, -1.5]], dtype=torch.float64)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_k3_nullifying_projects_out_every_class_direction_hand_computed():
    """The three one-vs-rest directions span the plane ⟂ (1, 1, 1): projecting it out leaves each row's mean on
    every coordinate, 3e₂ → (1, 1, 1)."""
    X, z = _three_classes()
    m = INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}).fit(X, z)
    out = m.transform(torch.tensor([[0.0, 3, 0], [2, 1, 0]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1, 1], [1, 1, 1]], dtype=torch.float64), atol=1e-6, rtol=0)


def test_k2_counterfactual_sets_the_class_mean_coordinate_hand_computed():
    """Binary: one direction a = (μ₁ − μ₀)/|μ₁ − μ₀| = e₁ for X = {(0, 1), (0, 3)} vs {(2, 5), (4, 7)}: a = (1, 1)/√2 …
    here μ₀ = (0, 2), μ₁ = (3, 6), a = (3, 4)/5; t₀ = aᵀμ₀ = 1.6, t₁ = aᵀμ₁ = 6.6. Row (0, 1) to z′ = 1:
    x + (6.6 − 0.8)·(0.6, 0.8) = (3.48, 5.64)."""
    X = torch.tensor([[0.0, 1], [0, 3], [2, 5], [4, 7]], dtype=torch.float64)
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, torch.tensor([0, 0, 1, 1]))
    assert m.targets_.tolist() == pytest.approx([1.6, 6.6])
    out = m.transform(torch.tensor([[0.0, 1]], dtype=torch.float64), torch.tensor([1]))
    torch.testing.assert_close(out, torch.tensor([[3.48, 5.64]], dtype=torch.float64), atol=1e-6, rtol=0)


def test_k4_nullifying_on_random_states_removes_exactly_the_span_of_the_class_means():
    """Independent recomputation: on random float32 states with 4 classes the one-vs-rest mean directions span the 3
    dimensions of {μ_c − μ}; the edit is the projection onto its orthogonal complement (numpy's SVD of the centred
    class means) — no fourth, arbitrary direction (a QR of the 4 dependent directions added one)."""
    g = torch.Generator().manual_seed(0)
    z = torch.arange(40) % 4
    X = torch.randn(40, 12, generator=g) + 2.0 * torch.nn.functional.one_hot(z, 12).float()
    m = INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}).fit(X, z)
    Xn = X.double().numpy()
    means = np.stack([Xn[z.numpy() == c].mean(0) for c in range(4)]) - Xn.mean(0)
    U, S, _ = np.linalg.svd(means.T, full_matrices=False)
    B = U[:, S > 1e-6 * S.max()]
    assert B.shape[1] == 3
    want = Xn - Xn @ B @ B.T
    np.testing.assert_allclose(m.transform(X).double().numpy(), want, atol=2e-5)


# ----------------------------------------------------------------------------------------------- leaderboard
def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_nan_items_are_left_out_of_the_bootstrap():
    """Items [0, 0, 0, 1] (the 2.5% / 97.5% quantiles 0 and 0.75, hand-computed in test_leaderboard) with two NaN
    items beside them: the same interval — NaN items are not resampled (kept, the interval is NaN)."""
    lo, hi, kind = interval(np.array([0.25]), [np.array([0.0, np.nan, 0.0, 0.0, np.nan, 1.0])], n_boot=20000,
                            rng=_rng())
    assert (lo, hi, kind) == (0.0, 0.75, "items")


def _records(rows: list[dict]) -> pd.DataFrame:
    base = {"study": "s", "dataset": "d", "model": "m", "method": "a", "setting": "{}", "slice": "{}", "seed": 0,
            "config_id": "c", "metric": "reliability"}
    return R.finish(pd.DataFrame([{**base, **r} for r in rows]))


def test_the_cell_is_the_mean_over_four_seeds_with_a_t_interval():
    """Seeds 0.1, 0.2, 0.3, 1.0: mean 0.4 (the median would be 0.25); sd = √((0.09 + 0.04 + 0.01 + 0.36)/3) =
    0.408248, t(0.975, 3) = 3.182446, so 0.4 ± 3.182446 · 0.408248 / √4 = 0.4 ± 0.649614."""
    recs = _records([{"value": v, "seed": s} for s, v in enumerate((0.1, 0.2, 0.3, 1.0))])
    row = leaderboard(recs).iloc[0]
    sd = float(np.std([0.1, 0.2, 0.3, 1.0], ddof=1))
    assert sd == pytest.approx(0.408248, abs=1e-6)
    assert row["mean"] == pytest.approx(0.4) and row["seeds"] == 4
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(0.4 - 0.649614, abs=1e-6),
                                               pytest.approx(0.4 + 0.649614, abs=1e-6))
    assert row["ci"] == CI_TEXT["seeds"] + " (95%, 3 df)"


def test_a_cells_items_count_the_defined_ones_and_its_interval_skips_the_nan_ones():
    """Four seeds, each with items [0, 0, 0, 1] and two NaN items: the cell averages 4 items per seed, its interval
    is finite and inside [0, 1] (two-stage bootstrap of the defined items)."""
    recs = _records([{"value": 0.25, "seed": s} for s in range(4)])
    items = pd.concat([R.item_rows(recs[recs["seed"] == s], {"reliability": [0.0, np.nan, 0.0, 0.0, np.nan, 1.0]},
                                   [f"i{k}" for k in range(6)]) for s in range(4)])
    row = leaderboard(recs, items).iloc[0]
    assert row["items"] == 4 and row["ci"].startswith(CI_TEXT["seeds+items"])
    assert 0.0 <= row["ci_low"] < 0.25 < row["ci_high"] <= 0.75


# ----------------------------------------------------------------------------------------------- records
def test_a_records_n_is_the_number_of_its_defined_items():
    """Selectivity over 5 scored rows of which 2 have no non-targeted property (NaN): n = 3; completeness, all
    defined: 5; a record without per-item values keeps its n."""
    recs = _records([{"metric": m, "value": 0.5, "n": 5} for m in ("oracle_completeness", "oracle_selectivity")]
                    + [{"metric": "reliability", "value": 0.5, "n": 5}])
    items = R.item_rows(recs, {"oracle_completeness": [1.0, 0.0, 1.0, 0.5, 0.0],
                               "oracle_selectivity": [1.0, np.nan, 0.5, np.nan, 0.0]}, list("abcde"))
    out = R.count_items(recs, items).set_index("metric")["n"]
    assert (out["oracle_completeness"], out["oracle_selectivity"], out["reliability"]) == (5, 3, 5)
    assert str(R.count_items(recs, items)["n"].dtype) == "Int64"


def test_reliability_records_count_the_rows_each_selectivity_is_defined_on(tmp_path):
    """The study's per-row file (completeness, selectivity, selectivity per property): the whole-set selectivity and
    the per-property one count the rows where a non-targeted property applies, through the job's records."""
    from cprobe.outputs import make_records
    from cprobe.tasks.reliability import ITEMS_FILE, _write_items

    table = pd.DataFrame([{
        "model": "m", "dataset": "d", "layer": 2, "position": "target", "target": "z_c", "method": "leace",
        "kind": "nullifying", "hparam": None, "hparam_value": None, "completeness": 0.5, "selectivity": 0.5,
        "reliability": 0.5, "selectivity_z_e": 0.5, "oracle_probe": "mlp", "n_test": 5, "n_scored": 5,
        "read_layer": 2, "sites": "2", "mode": "single"}])
    nan = float("nan")
    per = _write_items(tmp_path / ITEMS_FILE, np.arange(5), None, {2: {
        "completeness": torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0], dtype=torch.float64),
        "selectivity": torch.tensor([1.0, nan, 0.5, nan, 0.0], dtype=torch.float64),
        "selectivity_z_e": torch.tensor([1.0, nan, 0.5, nan, 0.0], dtype=torch.float64)}})
    recs, items = make_records("reliability", table, per, "cfg", 0)
    n = {(m, s): v for m, s, v in zip(recs["metric"], recs["slice"], recs["n"])}
    assert n["oracle_completeness", "{}"] == 5 and n["oracle_selectivity", "{}"] == 3
    assert n["oracle_selectivity", '{"property":"z_e"}'] == 3 and n["reliability", "{}"] == 5
    assert len(items) == 15
