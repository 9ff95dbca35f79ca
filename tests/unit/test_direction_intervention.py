"""Directions as interventions (cprobe.interventions.direction), the agreement grammar's minimal pairs, and the one
implementation of class means and logistic regression the method families share (cprobe.stats)."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError, DataError
from cprobe.interventions import INTERVENTIONS
from cprobe.interventions.direction import BRIDGED, Through


def _data(n: int = 200, d: int = 6, k: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.arange(n) % k
    X = torch.randn(n, d, generator=g) + 3.0  # off-centre: the targets are not 0
    X[:, 0] += 2.0 * z
    X[:, 1] -= 1.0 * z
    return X, z


NON_CAUSAL = [n for n, d in BRIDGED.items() if not INTERVENTIONS.get(n).needs_model]


def test_every_direction_method_that_learns_one_direction_is_bridged_under_its_own_name():
    """Not the whole-vector swap, a mask over features (DBM) or learnt features (RAVEL's SAE method): none is one
    direction to edit along."""
    from cprobe.directions import DIRECTIONS

    learned = {n for n in DIRECTIONS.names()
               if not any(getattr(DIRECTIONS.get(n), c) for c in ("whole_vector", "feature_mask", "features"))}
    assert set(BRIDGED.values()) == learned
    assert {"das", "probe_direction", "mean_direction", "lda_direction", "pca_direction", "kmeans_direction",
            "random_direction"} <= set(INTERVENTIONS.names())
    # capabilities come from the direction's declaration
    assert INTERVENTIONS.get("das").needs_model and not INTERVENTIONS.get("mean_direction").needs_model


@pytest.mark.parametrize("name", list(BRIDGED))
def test_the_bridge_finds_the_home_methods_direction(name):
    """Through the bridge, a direction is the one its home study (CausalGym) finds on the same rows and seed."""
    from cprobe.directions import DIRECTIONS

    X, z = _data()
    home = DIRECTIONS.build({"name": BRIDGED[name], **({"epochs": 1} if name == "das" else {})}, seed=3)
    bridged = INTERVENTIONS.build({"name": name, **({"epochs": 1} if name == "das" else {})}, seed=3)
    if bridged.needs_model:
        W = torch.randn(2, X.shape[1], generator=torch.Generator().manual_seed(1))
        forward = lambda edit, idx: edit(X[idx]) @ W.T  # noqa: E731
        home.fit(forward, X.flip(0), 1 - z)
        bridged.fit(X, z, through=Through(forward, X.flip(0), 1 - z))
    else:
        home.fit(X, z)
        bridged.fit(X, z)
    torch.testing.assert_close(bridged.a, home.a, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_counterfactual_sets_the_coordinate_to_the_target_class_mean_and_keeps_the_complement(name):
    X, z = _data()
    m = INTERVENTIONS.build({"name": name}, seed=0).fit(X, z)
    a = m.a.double()
    assert float(a.norm()) == pytest.approx(1.0, abs=1e-6)
    coord = X.double() @ a
    # the target statistic: the mean of a·x over the fitting rows of each class (computed here independently)
    expected = torch.stack([coord[z == c].mean() for c in range(2)])
    torch.testing.assert_close(m.targets_.cpu(), expected, atol=1e-5, rtol=0)
    goal = 1 - z
    out = m.transform(X, goal).double()
    torch.testing.assert_close(out @ a, expected[goal], atol=1e-4, rtol=0)  # the coordinate, set exactly
    complement = lambda Y: Y - (Y @ a)[:, None] * a  # noqa: E731
    torch.testing.assert_close(complement(out), complement(X.double()), atol=1e-4, rtol=0)
    # setting each row to its own class's value moves it only along a, by (t_z − a·x)
    same = m.transform(X, z).double()
    torch.testing.assert_close(same - X.double(), (expected[z] - coord)[:, None] * a, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_nullifying_projects_the_coordinate_out_and_keeps_the_complement(name):
    X, z = _data()
    m = INTERVENTIONS.build({"name": name, "kind": "nullifying"}, seed=0).fit(X, z)
    assert m.kind == "nullifying"
    a = m.a.double()
    out = m.transform(X).double()
    torch.testing.assert_close(out @ a, torch.zeros(len(X), dtype=torch.float64), atol=1e-4, rtol=0)
    torch.testing.assert_close(out - (out @ a)[:, None] * a, X.double() - (X.double() @ a)[:, None] * a,
                               atol=1e-4, rtol=0)


def test_hand_computed_mean_direction_case():
    """Class 0 at (0, 0) and (0, 2), class 1 at (2, 0) and (2, 2): a = (1, 0), t = (0, 2); a row (0.5, 7) set to
    class 1 becomes (2, 7), nullified (0, 7)."""
    X = torch.tensor([[0.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 2.0]])
    z = torch.tensor([0, 0, 1, 1])
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    torch.testing.assert_close(m.a, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(m.targets_, torch.tensor([0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(m.transform(torch.tensor([[0.5, 7.0]]), torch.tensor([1])), torch.tensor([[2.0, 7.0]]))
    null = INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}).fit(X, z)
    torch.testing.assert_close(null.transform(torch.tensor([[0.5, 7.0]])), torch.tensor([[0.0, 7.0]]))


def test_supervised_direction_on_three_classes_fits_one_direction_per_class():
    X, z = _data(n=300, k=3)
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    assert m.A.shape == (3, X.shape[1])
    for c in range(3):  # class c against the rest
        mu = X[z == c].mean(0) - X[z != c].mean(0)
        torch.testing.assert_close(m.A[c], mu / mu.norm(), atol=1e-5, rtol=0)
    goal = (z + 1) % 3
    out = m.transform(X, goal)
    torch.testing.assert_close(m.coordinate(out, goal).double(), m.targets_[goal], atol=1e-4, rtol=0)
    null = INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}).fit(X, z).transform(X)
    torch.testing.assert_close(null @ m.A.T, torch.zeros(len(X), 3), atol=1e-4, rtol=0)


def test_das_trains_through_the_model_and_sets_its_coordinate():
    """A frozen 'model' reads token 1 iff x·u > 0; the minimal-pair source of each row is its mirror along u, so DAS
    finds a direction close to ±u, and the counterfactual along it flips the model's reading."""
    d = 5
    g = torch.Generator().manual_seed(0)
    u = torch.zeros(d)
    u[2] = 1.0
    z = torch.arange(64) % 2
    X = torch.randn(64, d, generator=g)
    X[:, 2] = torch.where(z == 1, 2.0, -2.0) + 0.1 * torch.randn(64, generator=g)
    src = X.clone()
    src[:, 2] = -X[:, 2]  # the twin: only the property flipped
    W = torch.stack([-u, u]) * 3.0

    def forward(edit, idx):
        return edit(X[idx]) @ W.T

    m = INTERVENTIONS.build({"name": "das", "lr": 0.05, "epochs": 4}, seed=0)
    with pytest.raises(ConfigError, match="through"):
        m.fit(X, z)
    m.fit(X, z, through=Through(forward, src, 1 - z))
    # the DII moves x·u to x·u (1 − 2 (a·u)²): it flips the model's reading iff (a·u)² > 1/2 (the loss sees nothing else)
    assert float(m.a @ u) ** 2 > 0.6
    flipped = forward(lambda h: m.transform(h, 1 - z), torch.arange(64)).argmax(1) == 1 - z
    assert flipped.float().mean() > 0.9
    out = m.transform(X, 1 - z).double()
    torch.testing.assert_close(out @ m.a.double(), m.targets_[1 - z], atol=1e-4, rtol=0)


def test_bad_settings_are_one_line_errors_at_build():
    with pytest.raises(ConfigError, match="unknown key"):
        INTERVENTIONS.build({"name": "probe_direction", "lr": 1.0})
    with pytest.raises(ConfigError, match="kind must be"):
        INTERVENTIONS.build({"name": "mean_direction", "kind": "erase"})
    X, z = _data(k=3)
    m = INTERVENTIONS.build({"name": "pca_direction"}).fit(X, z)  # unsupervised: one direction for any k
    assert m.A.shape[0] == 1
    with pytest.raises(ConfigError, match="z_target"):
        m.transform(X)
    with pytest.raises(DataError, match="single class"):
        INTERVENTIONS.build({"name": "mean_direction"}).fit(X, torch.zeros(len(X), dtype=torch.long))


# ------------------------------------------------------------------------------- minimal pairs


def test_the_grammar_emits_minimal_pairs_that_flip_only_the_subject_number():
    from cprobe.data.grammar import GrammarConfig, generate

    cfg = GrammarConfig(n_sentences=200, seed=3, attractor_agreement=True)
    base, twin = generate(cfg), generate(cfg, flip="z_c")
    assert [e.id for e in base.examples] == [e.id for e in twin.examples]
    for b, t in zip(base.examples, twin.examples):
        assert b.props["z_c"] != t.props["z_c"]
        assert {k: v for k, v in b.props.items() if k != "z_c"} == {k: v for k, v in t.props.items() if k != "z_c"}
        assert (t.correct, t.wrong) == (b.wrong, b.correct) and t.target == b.target
        changed = [i for i, (x, y) in enumerate(zip(b.words, t.words)) if x != y]
        assert len(b.words) == len(t.words) and changed[-1] == b.target  # the verb slot and the words before it
        # apart from the verb: the subject noun and, in a subject relative, its verb — never more than two words
        assert 1 <= len(changed) - 1 <= 2, (b.sentence(), t.sentence())
    with pytest.raises(ConfigError, match="flip"):
        generate(cfg, flip="z_e")


def test_minimal_pairs_are_matched_by_id_and_refused_for_datasets_that_cannot_emit_them(tmp_path):
    from cprobe.data.registry import load_dataset, minimal_pairs, pairs_refusal

    cfg = {"name": "s", "type": "synthetic", "grammar": {"n_sentences": 50, "seed": 1}, "duplicates": "drop"}
    ds = load_dataset(cfg, tmp_path)
    some = [ds.examples[i] for i in (3, 0, 7)]
    twins = minimal_pairs(cfg, tmp_path, "z_c", some)
    assert [t.id for t in twins] == [e.id for e in some] and all(t.correct == e.wrong for t, e in zip(twins, some))
    assert pairs_refusal(cfg, "z_c") is None
    assert "not 'z_e'" in pairs_refusal(cfg, "z_e")
    assert "cannot emit minimal pairs" in pairs_refusal({"name": "lgd", "type": "lgd", "path": "x"}, "z_c")


# ------------------------------------------------------------------------------- one implementation, same numbers


def test_mean_direction_and_mean_diff_share_class_means_with_the_old_numbers():
    from cprobe.directions.mean_diff import MeanDirection
    from cprobe.interventions.mean_diff import MeanDiff
    from cprobe.stats import ClassMeans

    X, z = _data(n=101, d=7)
    old = X[z == 1].mean(0) - X[z == 0].mean(0)  # the old `mean` direction's formula
    torch.testing.assert_close(MeanDirection().fit(X, z).a, old / old.norm(), atol=1e-6, rtol=0)
    md = MeanDiff().fit(X, z)
    torch.testing.assert_close(md.means, torch.stack([X[z == 0].mean(0), X[z == 1].mean(0)]), atol=1e-5, rtol=0)
    stats = ClassMeans().update(X[:40], z[:40]).update(X[40:], z[40:])
    torch.testing.assert_close(stats.means().float(), md.means)
    # the mean direction is the (sign-free) basis of mean_diff's span for two classes
    assert abs(float(md.basis[:, 0] @ MeanDirection().fit(X, z).a)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("lam", [0.5, 10.0])
def test_probe_direction_on_the_shared_solver_equals_the_old_saga_fit(lam):
    """The `probe` direction moved from scikit-learn's SAGA to the shared Newton solver: the same objective, so the same
    direction where SAGA converges (the old entry point's numbers, recomputed here with scikit-learn)."""
    from sklearn.linear_model import LogisticRegression

    from cprobe.directions.probe import LogisticDirection

    g = torch.Generator().manual_seed(5)
    X = torch.randn(300, 5, generator=g)
    y = (X[:, 0] - 0.7 * X[:, 3] + 0.8 * torch.randn(300, generator=g) > 0).long()
    old = LogisticRegression(C=1 / lam, solver="saga", max_iter=100_000, tol=1e-10, random_state=0)
    old.fit(X.double().numpy(), y.numpy())
    new = LogisticDirection(lam=lam).fit(X, y)
    w = torch.from_numpy(old.coef_[0]).float()
    torch.testing.assert_close(new.a, w / w.norm(), atol=1e-5, rtol=0)
    assert new.intercept_ == pytest.approx(float(old.intercept_[0]), abs=1e-5)
    assert new.score(X, y) == pytest.approx(old.score(X.double().numpy(), y.numpy()))


def test_the_old_logistic_import_path_is_the_shared_solver():
    import cprobe.interventions.logistic as old
    import cprobe.stats as shared

    assert old.fit_logistic is shared.fit_logistic and old.l2_for_C is shared.l2_for_C
