"""One conformance suite over every registered estimator (scikit-learn's ``check_estimator`` idea): every probe,
intervention and direction method, present and future, is checked for the interface's promises — inputs never
modified, shape and dtype kept, deterministic under a seed, the declared kind honoured, and a clear error when
used unfitted. A newly registered class is picked up automatically; it needs an entry in ``SMALL`` only when
its constructor has required arguments."""

from __future__ import annotations

import pytest
import torch

from cprobe.directions import DIRECTIONS
from cprobe.errors import CprobeError, NotFittedError
from cprobe.interventions import INTERVENTIONS
from cprobe.probes import PROBES

SMALL = {  # required arguments (and budgets small enough for a unit test)
    ("intervention", "inlp"): {"rank": 2}, ("intervention", "alterrep"): {"rank": 2},
    ("intervention", "rlace"): {"rank": 1, "max_steps": 200}, ("intervention", "fgsm"): {"eps": 0.5},
    ("intervention", "pgd"): {"eps": 0.5}, ("intervention", "autoattack"): {"eps": 0.5},
    ("probe", "linear"): {"lrs": (1e-1,), "epochs": 20}, ("probe", "mlp"): {"lrs": (1e-2,), "epochs": 10,
                                                                          "widths": (16,), "n_layers": (1,)},
    ("direction", "das"): {"epochs": 1}, ("intervention", "das"): {"epochs": 1},
}
GBI_PROBE = {"name": "mlp", "lrs": (1e-2,), "epochs": 3, "widths": (16,), "n_layers": (1,)}


def data(seed: int = 0, n: int = 120, d: int = 6):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    z = (X[:, 0] + 0.5 * X[:, 1] > 0).long()
    X[:, 0] += 2.0 * (z * 2 - 1)  # well separated along x0
    return X, z


def build(kind: str, name: str, seed: int = 0):
    reg = {"intervention": INTERVENTIONS, "probe": PROBES, "direction": DIRECTIONS}[kind]
    cfg = {"name": name, **SMALL.get((kind, name), {})}
    if kind == "intervention" and reg.get(name).needs_probe:
        cfg["probe"] = GBI_PROBE
    return reg.build(cfg, seed=seed)


def fit(kind: str, est, X, z):
    if kind == "direction" and type(est).causal:
        return est.fit(_toy_forward(X.shape[1]), X.clone(), z.clone())
    if kind == "intervention" and type(est).needs_model:  # trained through the model on minimal pairs (DAS)
        from cprobe.interventions.direction import Through

        return est.fit(X, z, through=Through(_toy_forward(X.shape[1]), X.clone(), z.clone()))
    return est.fit(X, z)


def _toy_forward(d: int):
    """A frozen 'model' for causal direction methods: logits over 2 tokens read off the edited site."""
    W = torch.randn(2, d, generator=torch.Generator().manual_seed(1))
    X0, _ = data()

    def forward(edit, idx):
        return edit(X0[idx]) @ W.T
    return forward


INTERVENTION_NAMES = INTERVENTIONS.names()
PROBE_NAMES = PROBES.names()
DIRECTION_NAMES = DIRECTIONS.names()


def test_every_registered_name_is_checked():
    assert {"inlp", "rlace", "leace", "alterrep", "mean_diff", "fgsm", "pgd", "autoattack"} <= set(INTERVENTION_NAMES)
    assert {"das", "probe_direction", "mean_direction", "lda_direction", "pca_direction", "kmeans_direction",
            "random_direction"} <= set(INTERVENTION_NAMES)  # directions as interventions
    assert {"das", "probe", "mean", "lda", "pca", "kmeans", "random", "vanilla"} <= set(DIRECTION_NAMES)
    assert {"linear", "mlp"} <= set(PROBE_NAMES)


# ---------------------------------------------------------------------------------- interventions


@pytest.mark.parametrize("name", INTERVENTION_NAMES)
def test_intervention_conformance(name):
    X, z = data()
    X0, z0 = X.clone(), z.clone()
    cls = INTERVENTIONS.get(name)
    assert cls.kind in ("nullifying", "counterfactual")
    est = build("intervention", name)
    with pytest.raises(NotFittedError, match="not fitted"):
        est.transform(X, 1 - z)  # unfitted
    assert fit("intervention", est, X, z) is est
    target = 1 - z if cls.kind == "counterfactual" else None
    out = est.transform(X, target)
    assert torch.equal(X, X0) and torch.equal(z, z0)  # inputs untouched
    assert out.shape == X.shape and out.dtype == X.dtype and torch.isfinite(out).all()
    assert not torch.equal(out, X)  # it intervenes
    if cls.kind == "counterfactual":
        with pytest.raises(CprobeError, match="z_target"):
            est.transform(X)
    # deterministic under a seed
    again = fit("intervention", build("intervention", name), X, z).transform(X, target)
    torch.testing.assert_close(out, again)
    if cls.needs_probe:  # attacking an already-fitted probe is fitting too
        probe = PROBES.build(GBI_PROBE, seed=0).fit(X, z)
        attack = build("intervention", name).use_probe(probe)
        assert attack.transform(X, target).shape == X.shape
    # float64 in, float64 out
    X64 = X.double()
    assert est.transform(X64, target).dtype == torch.float64


# ---------------------------------------------------------------------------------- probes


@pytest.mark.parametrize("name", PROBE_NAMES)
def test_probe_conformance(name):
    X, z = data()
    X0 = X.clone()
    est = build("probe", name)
    with pytest.raises(NotFittedError, match="not fitted"):
        est.predict_proba(X)
    assert est.fit(X, z) is est
    p = est.predict_proba(X)
    assert torch.equal(X, X0)
    assert p.shape == (len(X), 2) and torch.allclose(p.sum(1), torch.ones(len(X)), atol=1e-5)
    assert est.score(X, z) > 0.9  # separable data
    torch.testing.assert_close(build("probe", name).fit(X, z).predict_proba(X), p)


# ---------------------------------------------------------------------------------- directions


@pytest.mark.parametrize("name", DIRECTION_NAMES)
def test_direction_conformance(name):
    X, z = data()
    X0, z0 = X.clone(), z.clone()
    est = build("direction", name)
    with pytest.raises(NotFittedError, match="not fitted"):
        est.a  # noqa: B018  (unfitted)
    assert fit("direction", est, X, z) is est
    assert torch.equal(X, X0) and torch.equal(z, z0)
    if type(est).whole_vector:  # the whole-vector swap learns no direction
        assert est.a is None
        return
    a = est.a
    assert a.shape == (X.shape[1],) and a.dtype == torch.float32
    torch.testing.assert_close(a.norm(), torch.tensor(1.0))
    torch.testing.assert_close(fit("direction", build("direction", name), X, z).a, a)
    if type(est).supervised:  # a label-using method finds the planted separating coordinate
        assert abs(float(a[0])) > 0.5


@pytest.mark.parametrize("name", ["leace", "mean_diff"])
def test_streaming_update_equals_one_fit(name):
    """update() over batches (uneven, one missing a class) gives the eraser/steerer of one fit on all rows."""
    X, z = data(n=300, d=8)
    X = X * torch.linspace(0.5, 3.0, 8) + 4.0  # off-centre, anisotropic: the merge of means matters
    full = build("intervention", name).fit(X, z)
    stream = build("intervention", name)
    order = torch.argsort(z, stable=True)  # the first batch holds class 0 only
    for chunk in torch.split(order, [50, 37, 113, 100]):
        stream.update(X[chunk], z[chunk])
    target = 1 - z if full.kind == "counterfactual" else None
    torch.testing.assert_close(stream.transform(X, target), full.transform(X, target), atol=1e-4, rtol=1e-4)
    if name == "leace":
        torch.testing.assert_close(stream.P, full.P, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(stream.means, full.means)
    stream.update(X[:60] * 3.0, z[:60])  # more data after use: every public attribute follows
    again = build("intervention", name).fit(torch.cat([X, X[:60] * 3.0]), torch.cat([z, z[:60]]))
    if name == "leace":
        torch.testing.assert_close(stream.P, again.P, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stream.bias, again.bias, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(stream.means, again.means)
    with pytest.raises(NotFittedError):
        build("intervention", name).P if name == "leace" else build("intervention", name).nearest_class(X)
