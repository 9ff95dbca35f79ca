"""CausalGym's engine checked by value against independent recomputations (issue 30), on the tiny random GPT-NeoX of
test_causalgym_task.py: the edit a direction intervention runs is the one its *instance* declares (``kind:
nullifying`` is scored as an eraser), and an eraser's erasure is measured at sites that reach the output, where
swapping the clean and the edited runs changes the number.

Every expected number here is computed apart from the engine: the direction from the class means by hand, the edit
as a projection, the write-back through the model's one entry point, the metrics from their formulas."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cprobe.compute import threads
from cprobe.data.causalgym import make_pair_splits, pair_items
from cprobe.interventions import INTERVENTIONS
from cprobe.models.edits import Replace
from cprobe.models.formatters import RegionFormatter
from cprobe.tasks.causalgym_engine import oracle_probe, run_gym_task, site_of
from tests.conftest import numeric_threads
from tests.integration.test_causalgym_task import ORACLE, Side, _settings, adapter, template  # noqa: F401

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

REACHING = [(1, "{subject}"), (2, "{object}")]
"""Sites whose edit reaches the label's log-odds (block 2 is the last: there only the last region, where the label is
predicted, does; its subject state is read by nothing)."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread (on a loaded 2-core box two threads ran the peer's loop 30x slower), or
    ``CPROBE_TEST_THREADS`` (``make test-portable``)."""
    with threads(numeric_threads(1)):
        yield


def _by_hand(adapter, template, layer: int, region: int, edit) -> dict[str, float]:  # noqa: F811
    """The clean and edited runs at one site, and every CausalGym score of the edit, from the formulas: the base
    train states' class means give the direction; ``edit(X_eval, a)`` the edited eval states."""
    splits = make_pair_splits(template, 8, 4)
    tr, ev = Side(adapter, splits.train, layer, region), Side(adapter, splits.eval, layer, region)
    z_tr = torch.tensor([p.base_class for p in splits.train])
    X = tr.acts.double()
    a = X[z_tr == 1].mean(0) - X[z_tr == 0].mean(0)
    a = a / a.norm()
    edited = edit(ev.acts.double(), a).float()
    out = adapter.map(pair_items(splits.eval)[0], RegionFormatter(),
                      edits={site_of(layer, region, "block"): Replace(edited)}, readout=ev.readout).scores
    m = ev.scores[:, 0] - ev.scores[:, 1]  # clean log-odds of the base label over the source's
    m_star = out[:, 0] - out[:, 1]  # under the edit
    p = oracle_probe(ORACLE, seed=0).fit(tr.acts.float(), z_tr).predict_proba(edited).double()
    return {"odds": float((m - m_star).mean()), "erasure": float((m.abs() - m_star.abs()).mean()),
            "erased_fraction": 1.0 - float(m_star.abs().sum() / m.abs().sum()),
            "completeness_null": float((1.0 - (p[:, 0] - p[:, 1]).abs()).mean()),  # eq. 2 with k = 2
            "completeness_cf": float(p[torch.arange(len(p)), 1 - torch.tensor(
                [q.base_class for q in splits.eval])].mean()),  # eq. 1: P̂(source's class)
            "clean_margin": float(m.abs().mean())}


@pytest.fixture(scope="module")
def null_rows(adapter, template) -> pd.DataFrame:  # noqa: F811
    s = _settings(methods=["mean_direction"], layers=[1, 2], control=False, reliability=True, oracle_probe=ORACLE,
                  interventions={"mean_direction": {"kind": "nullifying"}}, read_layers=True)
    return pd.DataFrame(run_gym_task(adapter, template, *s))


def test_a_downstream_read_is_the_oracle_at_l_prime_on_the_pass_edited_at_l(adapter, template, null_rows):  # noqa: F811
    """``completeness_l2`` of the edit at layer 1 (subject): the oracle of (layer 2, subject), trained on clean layer-2
    states, reads the layer-2 state of the forward pass edited at layer 1 — recomputed here by reading layer 2 in a
    write-back of the projected layer-1 states (an l′ ≠ l case: reading the edited layer instead, or the layer-1
    oracle, gives another number)."""
    region = template.region_names.index("{subject}")
    splits = make_pair_splits(template, 8, 4)
    tr1, ev1 = Side(adapter, splits.train, 1, region), Side(adapter, splits.eval, 1, region)
    tr2 = Side(adapter, splits.train, 2, region)
    z_tr = torch.tensor([p.base_class for p in splits.train])
    X = tr1.acts.double()
    a = X[z_tr == 1].mean(0) - X[z_tr == 0].mean(0)
    a = a / a.norm()
    E = ev1.acts.double()
    edited = (E - (E @ a)[:, None] * a).float()
    at2 = site_of(2, region, "block")
    read = adapter.map(pair_items(splits.eval)[0], RegionFormatter(), read=[at2],
                       edits={site_of(1, region, "block"): Replace(edited)}).acts[at2]
    p2 = oracle_probe(ORACLE, seed=0).fit(tr2.acts.float(), z_tr).predict_proba(read).double()
    want = float((1.0 - (p2[:, 0] - p2[:, 1]).abs()).mean())
    row = null_rows.query("layer == 1 and region == '{subject}'").iloc[0]
    assert row["completeness_l2"] == pytest.approx(want, abs=1e-5)
    assert abs(row["completeness_l2"] - row["completeness_l1"]) > 1e-4  # l′ ≠ l: another number (2.7e-4 here)
    assert pd.isna(null_rows.query("layer == 2 and region == '{subject}'").iloc[0]["completeness_l1"])


@pytest.mark.parametrize(("layer", "name"), REACHING)
def test_a_direction_intervention_given_kind_nullifying_is_scored_as_the_eraser_it_is(adapter, template,  # noqa: F811
                                                                                      null_rows, layer, name):
    """``mean_direction`` with ``kind: nullifying`` projects the mean direction out (x′ = x − (aᵀx)a): its rows say
    ``edit = nullifying`` and carry the erasure, the erased fraction and the nullifying completeness (eq. 2), equal to
    their recomputation from the formulas; before the fix the class's default kind labelled it counterfactual (erasure
    NaN, completeness by eq. 1)."""
    region = template.region_names.index(name)
    want = _by_hand(adapter, template, layer, region, lambda X, a: X - (X @ a)[:, None] * a)
    row = null_rows.query("layer == @layer and region == @name").iloc[0]
    assert row["edit"] == "nullifying"
    assert want["clean_margin"] > 0.05 and abs(want["erasure"]) > 1e-3  # the site reaches the output
    assert row["odds"] == pytest.approx(want["odds"], abs=1e-5)
    assert row["erasure"] == pytest.approx(want["erasure"], abs=1e-5)
    assert row["erased_fraction"] == pytest.approx(want["erased_fraction"], abs=1e-5)
    assert row["completeness"] == pytest.approx(want["completeness_null"], abs=1e-5)
    assert abs(want["completeness_null"] - want["completeness_cf"]) > 1e-3  # the two formulas tell apart here


def test_the_instances_kind_reaches_the_records_family(null_rows):
    from cprobe.records import to_records
    from cprobe.tasks import causalgym as cg_task

    recs = to_records(null_rows.assign(model="toy"), cg_task.RECORDS, "causalgym", 0, "cfg")
    assert set(recs.loc[recs["method"] == "mean_direction", "family"]) == {"nullifying"}
    assert recs.loc[(recs["method"] == "mean_direction") & (recs["metric"] == "erasure"), "value"].notna().all()


@pytest.fixture(scope="module")
def leace_rows(adapter, template) -> pd.DataFrame:  # noqa: F811
    s = _settings(methods=["leace"], layers=[1, 2], control=False, reliability=False, intervention_directions=False)
    return pd.DataFrame(run_gym_task(adapter, template, *s))


@pytest.mark.parametrize(("layer", "name"), REACHING)
def test_erasure_is_clean_minus_edited_at_a_site_that_reaches_the_output(adapter, template, leace_rows,  # noqa: F811
                                                                         layer, name):
    """LEACE at a site whose edit moves the label log-odds: ``erasure`` = mean(|m| − |m*|) with m the
    clean run's log-odds and m* the edited run's, and ``erased_fraction`` = 1 − Σ|m*|/Σ|m|; swapping the clean and
    the edited runs flips the first's sign and changes the second, so both are checked against values away from 0."""
    region = template.region_names.index(name)
    splits = make_pair_splits(template, 8, 4)
    tr = Side(adapter, splits.train, layer, region)
    eraser = INTERVENTIONS.build({"name": "leace"}).fit(tr.acts, torch.tensor([p.base_class for p in splits.train]))
    # the edited states from the eraser itself (fitted as the engine does), the scores from the formulas
    ev = Side(adapter, splits.eval, layer, region)
    out = adapter.map(pair_items(splits.eval)[0], RegionFormatter(),
                      edits={site_of(layer, region, "block"): Replace(eraser.transform(ev.acts))},
                      readout=ev.readout).scores
    m, m_star = ev.scores[:, 0] - ev.scores[:, 1], out[:, 0] - out[:, 1]
    erasure = float((m.abs() - m_star.abs()).mean())
    fraction = 1.0 - float(m_star.abs().sum() / m.abs().sum())
    assert abs(erasure) > 1e-3, erasure  # not the vacuous 0 of a site that cannot reach the output (2.9e-3, 1.6e-2)
    row = leace_rows.query("layer == @layer and region == @name").iloc[0]
    assert row["erasure"] == pytest.approx(erasure, abs=1e-5)
    assert row["erased_fraction"] == pytest.approx(fraction, abs=1e-5)
