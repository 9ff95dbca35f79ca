"""Direction-finding methods: unit norm, recovery of a planted direction, DAS through a toy model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cprobe.models.edits import Edit, dii_edit
from cprobe.directions import DIRECTIONS
from cprobe.directions.das import DAS
from cprobe.directions.lda import LDA
from cprobe.directions.mean_diff import MeanDirection
from cprobe.directions.random import RandomDirection
from cprobe.errors import ConfigError, NotFittedError

ACTIVATION_METHODS = ["probe", "mean", "lda", "pca", "kmeans"]


def _planted(d: int = 32, n: int = 1000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two balanced classes at ±2u plus isotropic unit noise: u is the only class (and top-variance) axis."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g)
    u /= u.norm()
    y = torch.arange(n) % 2
    X = torch.randn(n, d, generator=g) + (4.0 * y.float() - 2.0)[:, None] * u
    return X, y, u


def test_registry_lists_every_method() -> None:
    assert DIRECTIONS.names() == sorted(["das", "dbm", "kmeans", "lda", "mean", "pca", "probe", "random", "sae_axbench",
                                         "sae_decoder", "sae_diffmean", "sae_features", "vanilla"])
    assert DIRECTIONS.get("das").causal and not DIRECTIONS.get("probe").causal
    # what a caller dispatches on: declared capabilities, one method each here
    assert [n for n in DIRECTIONS.names() if DIRECTIONS.get(n).whole_vector] == ["vanilla"]
    assert [n for n in DIRECTIONS.names() if DIRECTIONS.get(n).per_model_lambda] == ["probe"]
    assert [n for n in DIRECTIONS.names() if DIRECTIONS.get(n).chance_baseline] == ["random"]
    with pytest.raises(ConfigError, match="choose from"):
        DIRECTIONS.get("ica")


@pytest.mark.parametrize("name", ACTIVATION_METHODS)
def test_activation_methods_recover_planted_direction(name: str) -> None:
    X, y, u = _planted()
    a = DIRECTIONS.get(name)().fit(X, y).a
    assert a.shape == (32,) and a.dtype == torch.float32
    assert float(a.norm()) == pytest.approx(1.0, abs=1e-6)
    assert abs(float(a @ u)) > 0.95


def test_mean_diff_hand_computed() -> None:
    X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 4.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1, 1])
    # μ1 − μ0 = (0, 3) − (2, 0) = (−2, 3)
    torch.testing.assert_close(MeanDirection().fit(X, y).a, torch.tensor([-2.0, 3.0]) / 13**0.5)


def test_lda_is_inverse_shared_covariance_times_mean_difference() -> None:
    g = torch.Generator().manual_seed(3)
    mix = torch.randn(6, 6, generator=g)
    y = torch.arange(300) % 2
    X = torch.randn(300, 6, generator=g) @ mix + y[:, None].float() * torch.tensor([1.0, 0, 0, 0, 0, 0])
    Xn, yn = X.double().numpy(), y.numpy()
    mu0, mu1 = Xn[yn == 0].mean(0), Xn[yn == 1].mean(0)
    centred = np.concatenate([Xn[yn == 0] - mu0, Xn[yn == 1] - mu1])
    expected = np.linalg.solve(centred.T @ centred, mu1 - mu0)
    expected /= np.linalg.norm(expected)
    a = LDA().fit(X, y).a.double().numpy()
    assert abs(a @ expected) == pytest.approx(1.0, abs=1e-5)
    # correlated noise: LDA and the plain mean difference disagree
    assert abs(float(MeanDirection().fit(X, y).a.double() @ torch.from_numpy(expected))) < 0.99


def test_lda_closed_form_hand_computed_2d() -> None:
    """Class 0: (0, 0), (2, 2) (μ₀ = (1, 1)); class 1: (1, 3), (3, 3) (μ₁ = (2, 3)). Within-class scatter
    [[4, 2], [2, 2]], Σ = scatter / n = [[1, .5], [.5, .5]], Σ⁻¹ = [[2, −2], [−2, 4]], Δ = (1, 2), w = Σ⁻¹Δ = (−2, 6);
    equal priors: b = −w·x̄ = −w·(1.5, 2) = −9, so the decision x·w + b is −4 at μ₀, +4 at μ₁, 0 halfway."""
    from cprobe.directions.lda import lda_weight

    X = torch.tensor([[0.0, 0.0], [2.0, 2.0], [1.0, 3.0], [3.0, 3.0]])
    y = torch.tensor([0, 0, 1, 1])
    w, b, classes = lda_weight(X, y)
    torch.testing.assert_close(w, torch.tensor([-2.0, 6.0], dtype=torch.float64))
    assert b == pytest.approx(-9.0) and classes.tolist() == [0, 1]
    lda = LDA().fit(X, y)
    torch.testing.assert_close(lda.a, torch.tensor([-1.0, 3.0]) / 10**0.5)
    # just below and above halfway, (1.5, 2 ∓ 0.1): decisions ∓0.6
    assert lda.score(torch.tensor([[1.0, 1.0], [2.0, 3.0], [1.5, 1.9], [1.5, 2.1]]), torch.tensor([0, 1, 0, 1])) == 1.0


@pytest.mark.parametrize("n,d,collinear", [(300, 8, False), (40, 64, False), (25, 64, False), (300, 8, True),
                                            (25, 64, True)])
def test_lda_closed_form_equals_scikit_learns(n: int, d: int, collinear: bool) -> None:
    """The reference's LDA (SVD solver): the same weight (cosine > 1 − 1e-6; the same scale), intercept, decisions and
    accuracy, with unequal priors, on full-rank (n > d) and rank-deficient (n ≤ d: the pseudo-inverse) data; and where
    the solver's truncation decides (``collinear``): a feature that is another plus 1e-3 noise (singular value above
    ``tol``: kept), one that is another plus 1e-5 noise (below: dropped) and a constant feature (its deviation 0); with
    n ≤ d (the Gram of the rows), a row that is another of its class plus 1e-3 noise (kept), one plus 1e-5
    (dropped)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    from cprobe.directions.lda import lda_weight

    g = torch.Generator().manual_seed(n + d)
    mix = torch.randn(d, d, generator=g) / d**0.5 + torch.eye(d)
    y = (torch.rand(n, generator=g) < 0.4).long()
    y[:2] = torch.tensor([0, 1])
    X = torch.randn(n, d, generator=g) @ mix + y[:, None].float() * torch.randn(d, generator=g)
    if collinear and n > d:
        X[:, 1] = X[:, 0] + 1e-3 * torch.randn(n, generator=g)
        X[:, 2] = X[:, 3] + 1e-5 * torch.randn(n, generator=g)
        X[:, 4] = 2.0
    elif collinear:
        y[3], y[5] = y[2], y[4]
        X[3] = X[2] + 1e-3 * torch.randn(d, generator=g)
        X[5] = X[4] + 1e-5 * torch.randn(d, generator=g)
    ref = LinearDiscriminantAnalysis(n_components=1).fit(X.double().numpy(), y.numpy())
    w, b, _ = lda_weight(X, y)
    coef = torch.from_numpy(ref.coef_[0])
    assert float(w @ coef / (w.norm() * coef.norm())) > 1 - 1e-6
    torch.testing.assert_close(w, coef, rtol=1e-6, atol=1e-9 * float(coef.abs().max()))
    assert b == pytest.approx(float(ref.intercept_[0]), rel=1e-6, abs=1e-9)
    X_new = torch.randn(200, d, generator=g) @ mix
    y_new = (torch.arange(200) % 2)
    lda = LDA().fit(X, y)
    torch.testing.assert_close(X_new.double() @ w + b, torch.from_numpy(ref.decision_function(X_new.double().numpy())),
                               rtol=1e-6, atol=1e-8)
    assert lda.score(X_new, y_new) == pytest.approx(ref.score(X_new.double().numpy(), y_new.numpy()))


def test_probe_scores_and_accepts_lambda() -> None:
    X, y, _ = _planted()
    probe = DIRECTIONS.get("probe")(lam=10.0).fit(X, y)
    assert probe.score(X, y) > 0.95
    with pytest.raises(ValueError):
        DIRECTIONS.get("probe")(lam=0.0)


def test_supervised_methods_reject_non_binary_labels() -> None:
    X, _, _ = _planted(n=12)
    with pytest.raises(ValueError, match="class ids"):
        MeanDirection().fit(X, torch.arange(12) % 3)


def test_random_is_seeded_unit_and_nearly_orthogonal_in_high_dimension() -> None:
    X, y, u = _planted(d=2000, n=4, seed=7)
    a = RandomDirection(seed=0).fit(X, y).a
    assert float(a.norm()) == pytest.approx(1.0, abs=1e-6)
    assert abs(float(a @ u)) < 0.1  # |N(0, 1/d)| with d = 2000: sd ≈ 0.022
    torch.testing.assert_close(RandomDirection(seed=0).fit(X, y).a, a)
    assert not torch.equal(RandomDirection(seed=1).fit(X, y).a, a)


def _toy_model(d: int = 32, n: int = 400, seed: int = 0):
    """A linear 'LM' reading its site vector: logits = W h with W[0] = 4u, W[1] = −4u.

    Base rows sit at ±2u (class 0 / 1), source rows at the opposite side, and the target is
    the source's token; only a = ±u makes the 1-D swap flip the prediction.
    """
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g)
    u /= u.norm()
    W = torch.zeros(5, d)
    W[0], W[1] = 4 * u, -4 * u
    cls = torch.arange(n) % 2
    side = (1 - 2 * cls.float())[:, None] * u
    h_base = torch.randn(n, d, generator=g) + 2 * side
    h_source = torch.randn(n, d, generator=g) - 2 * side
    calls: list[torch.Tensor] = []

    def forward(edit: Edit, idx: torch.Tensor) -> torch.Tensor:
        calls.append(idx)
        return torch.log_softmax(edit(h_base[idx]) @ W.T, -1)

    return u, forward, h_source, 1 - cls, calls


def _ce(forward, h_source: torch.Tensor, target: torch.Tensor, a: torch.Tensor) -> float:
    everyone = torch.arange(len(target))
    return float(-forward(dii_edit(h_source, a), everyone)[everyone, target].mean())


def test_das_paper_schedule_stays_unit_and_improves() -> None:
    u, forward, h_source, target, calls = _toy_model(seed=11)
    init = _random_unit(32, seed=0)  # DAS(seed=0)'s starting point
    norms: list[float] = []
    das = DAS(seed=0).fit(forward, h_source, target, callback=lambda step, a: norms.append(float(a.norm())))
    assert float(das.a.norm()) == pytest.approx(1.0, abs=1e-6)
    assert norms == pytest.approx([1.0] * 100, abs=1e-5)  # unit at every step
    # paper schedule: 1 epoch of 400 items in batches of 4, in data order → 100 steps
    assert len(calls) == 100 and all(torch.equal(c, torch.arange(4 * i, 4 * i + 4)) for i, c in enumerate(calls))
    assert len(das.losses) == 100
    assert abs(float(das.a @ u)) > abs(float(init @ u)) + 0.4
    assert _ce(forward, h_source, target, das.a) < 0.5 * _ce(forward, h_source, target, init)


def test_das_finds_the_planted_direction_of_a_toy_model() -> None:
    u, forward, h_source, target, _ = _toy_model(seed=11)
    assert abs(float(_random_unit(32, seed=0) @ u)) < 0.2  # the start is far from u
    das = DAS(seed=0, epochs=3).fit(forward, h_source, target)
    assert abs(float(das.a @ u)) > 0.9


def _random_unit(d: int, seed: int) -> torch.Tensor:
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def test_das_first_step_has_zero_learning_rate() -> None:
    u, forward, h_source, target, _ = _toy_model(n=40)
    seen: list[torch.Tensor] = []
    DAS(seed=5).fit(forward, h_source, target, callback=lambda step, a: seen.append(a))
    torch.testing.assert_close(seen[0], _random_unit(32, seed=5))  # warm-up starts from lr = 0
    assert not torch.allclose(seen[1], seen[0])


def test_random_direction_overlap_with_a_fixed_feature_is_one_over_d_on_average() -> None:
    """Why the random baseline's odds is not exactly 0: a 1-D DII along a random unit ``a`` moves a
    fixed feature u by (a·u)², whose mean is 1/d (≈ vanilla/d in odds), with a χ²₁ spread per draw."""
    d = 128
    u = torch.zeros(d)
    u[0] = 1.0
    overlap = torch.stack([(RandomDirection(seed=s).fit(torch.zeros(1, d)).a @ u) ** 2 for s in range(4000)])
    assert overlap.mean().item() == pytest.approx(1 / d, rel=0.1)
    assert overlap.std().item() == pytest.approx(np.sqrt(2) / d, rel=0.15)  # χ²₁/d: sd √2/d


@pytest.mark.parametrize("lam", [0.5, 10.0])
def test_probe_minimises_log_loss_plus_half_lambda_squared_norm(lam):
    """CausalGym eq. 13: Σ log-loss + (λ/2)‖w‖² (intercept unpenalised), i.e. scikit-learn's C = 1/λ.

    At the optimum the gradient X̃ᵀ(p − y) + λw vanishes; with C = λ it would be X̃ᵀ(p − y) + w/λ instead.
    """
    from cprobe.directions.probe import LogisticDirection

    g = torch.Generator().manual_seed(3)
    X = torch.randn(200, 4, generator=g, dtype=torch.float64)
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.8 * torch.randn(200, generator=g, dtype=torch.float64) > 0).long()
    probe = LogisticDirection(lam=lam).fit(X, y)
    w, b = probe.coef_.numpy(), probe.intercept_
    Xn, yn = X.numpy(), y.numpy()
    p = 1 / (1 + np.exp(-(Xn @ w + b)))
    grad_w = Xn.T @ (p - yn) + lam * w
    grad_b = (p - yn).sum()
    # Newton's optimum: the gradient vanishes (the C = λ optimum would be off by |λ − 1/λ|·‖w‖).
    assert np.abs(grad_w).max() < 1e-6 * len(y) and abs(grad_b) < 1e-6 * len(y)
    assert torch.allclose(probe.a.double().cpu(), torch.from_numpy(w / np.linalg.norm(w)), atol=1e-6)


def test_das_uses_the_orthogonal_parametrisation_by_default(monkeypatch) -> None:
    """As pyvene's rotate layer: the trained parameter is the orthogonal map's, not a raw vector, and the
    direction is unit at every step; the "normalize" option gives a different trajectory from the same start."""
    import torch.nn.utils.parametrizations as P

    calls = []
    real = P.orthogonal
    monkeypatch.setattr(P, "orthogonal", lambda m, *a, **k: calls.append(m.weight.shape) or real(m, *a, **k))
    _, forward, h_source, target, _ = _toy_model(seed=1)
    norms: list[float] = []
    ortho = DAS(seed=0).fit(forward, h_source, target, callback=lambda s, a: norms.append(float(a.norm())))
    assert calls == [torch.Size([32, 1])]
    assert max(abs(x - 1) for x in norms) < 1e-5
    plain = DAS(seed=0, parametrization="normalize").fit(forward, h_source, target)
    assert not torch.allclose(ortho.a, plain.a, atol=1e-3)
    with pytest.raises(ValueError, match="parametrization"):
        DAS(parametrization="cayley")


# ---------------------------------------------------------------------------------- DAS: batched, sync-free, seeded


def _sync_ops(fn) -> int:
    """How many host reads of tensor values (``.item()``, ``bool()``, ``float()``, ``nonzero`` ...) ``fn`` makes outside
    the optimiser's step (Adam reads its CPU step counter) and outside transformers' internals: each is a device sync
    on a GPU."""
    import torch.optim.optimizer as optim
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = ("_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "equal")

    class Count(TorchDispatchMode):
        n, stepping = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.stepping and any(r in str(func.overloadpacket) for r in reads):
                import traceback

                if not any("/transformers/" in f.filename for f in traceback.extract_stack()):
                    self.n += 1
            return func(*args, **(kwargs or {}))

    mode = Count()
    hooks = [optim.register_optimizer_step_pre_hook(lambda *a: setattr(mode, "stepping", True)),
             optim.register_optimizer_step_post_hook(lambda *a: setattr(mode, "stepping", False))]
    try:
        with mode:
            fn()
    finally:
        for h in hooks:
            h.remove()
    return mode.n


def test_das_reads_nothing_back_from_the_device_per_step() -> None:
    """No per-step host sync: the step count of host reads does not grow with the number of steps (the losses stay
    on the device until the end; today's ``loss.item()`` each step would add one per step)."""
    _, forward, h_source, target, _ = _toy_model(n=40)
    short = _sync_ops(lambda: DAS(seed=0, epochs=1).fit(forward, h_source, target))
    long = _sync_ops(lambda: DAS(seed=0, epochs=4).fit(forward, h_source, target))
    assert long == short  # 10 vs 40 steps
    das = DAS(seed=0, epochs=2).fit(forward, h_source, target)
    assert das.losses_.shape == (20, 1) and len(das.losses) == 20  # read once, at the end


@pytest.mark.numeric
def test_das_fit_many_equals_one_site_at_a_time() -> None:
    """K sites in one batched pass train the same directions as K separate fits (tolerance 1e-5: float summation
    order; measured ≤ 2e-7), with the per-site losses of the separate fits."""
    _, forward, h_source, target, _ = _toy_model(seed=5)
    H = torch.stack([h_source, h_source.flip(0), 0.5 * h_source])
    T = torch.stack([target, target.flip(0), 1 - target])

    def many(rows, hs, a):
        idx = torch.arange(rows.start, rows.stop)
        return torch.stack([forward(dii_edit(hs[k], a[k]), idx) for k in range(len(a))])

    for param in ("orthogonal", "normalize"):
        batched = DAS(seed=2, epochs=2, parametrization=param)
        A = batched.fit_many(many, H, T)
        for k in range(3):
            one = DAS(seed=2, epochs=2, parametrization=param).fit(forward, H[k], T[k])
            torch.testing.assert_close(A[k], one.a, atol=1e-5, rtol=0)
            np.testing.assert_allclose(batched.losses_[:, k].numpy(), one.losses, atol=1e-5)
        assert not torch.allclose(A[0], A[2], atol=1e-2)  # different problems, different directions


def test_das_does_not_depend_on_the_global_random_state() -> None:
    """The orthogonal parametrisation completes its start column with ``torch.randn``; drawn from the global generator
    it made a cold run (which trained a model first) differ from a warm one. Seeded, they are equal."""
    _, forward, h_source, target, _ = _toy_model(seed=3)
    torch.manual_seed(0)
    a = DAS(seed=4).fit(forward, h_source, target).a
    torch.manual_seed(123)
    torch.randn(1000)
    b = DAS(seed=4).fit(forward, h_source, target).a
    assert torch.equal(a, b)


def test_vectorised_householder_is_torchs_orthogonal_parametrisation() -> None:
    """The batched direction is torch's ``orthogonal`` map of the (d, 1) weight (pyvene's rotate layer) at any value
    of the trained parameter, not only at the start."""
    d, K = 16, 3
    das = DAS(seed=7)
    direction, (X,) = das._parametrise(K, d, torch.device("cpu"))
    init, base = das.start(d)
    torch.testing.assert_close(direction()[0], init)  # starts at the seeded start
    with torch.no_grad():
        X[:, 1:] += 0.3 * torch.randn(K, d - 1, generator=torch.Generator().manual_seed(1))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        rotate = torch.nn.Linear(1, d, bias=False)
        with torch.no_grad():
            rotate.weight.copy_(init[:, None])
        torch.nn.utils.parametrizations.orthogonal(rotate)
    torch.testing.assert_close(rotate.parametrizations.weight[0].base, base)
    for k in range(K):
        with torch.no_grad():
            rotate.parametrizations.weight.original.copy_(X[k][:, None])
        torch.testing.assert_close(direction()[k], rotate.weight[:, 0].detach(), atol=1e-6, rtol=0)
        assert float(direction()[k].detach().norm()) == pytest.approx(1.0, abs=1e-6)


def test_das_weighs_each_rows_loss():
    """``fit_many(weight=)``: a step's loss is the weighted mean of its rows' cross-entropies (multi-task DAS's Cause
    and Isolate rows); ones are the plain mean."""
    logits = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]], [[0.0, 1.0]]]).transpose(0, 1)  # (K=1, b=3, 2 classes)

    def forward(rows, h, a):  # the scores ignore the direction: only the loss is under test
        return logits[:, rows] + 0 * a.sum()

    target = torch.tensor([[0, 1, 1]])
    nll = -torch.log_softmax(logits, -1)[0, torch.arange(3), target[0]]  # ln 2, 2 + ln(1 + e^-2), ln(1 + e^-1)
    h = torch.zeros(1, 3, 4)
    das = DAS(batch_size=3, epochs=1, seed=0)
    das.fit_many(forward, h, target, weight=torch.tensor([[1.0, 0.0, 3.0]]))
    assert float(das.losses_[0, 0]) == pytest.approx(float((nll[0] + 3 * nll[2]) / 4), rel=1e-6)  # float32 sums
    das.fit_many(forward, h, target, weight=torch.ones(1, 3))
    assert float(das.losses_[0, 0]) == pytest.approx(float(nll.mean()), rel=1e-6)
    das.fit_many(forward, h, target)
    assert float(das.losses_[0, 0]) == pytest.approx(float(nll.mean()), rel=1e-6)
    with pytest.raises(ValueError, match=r"weight must be shaped as target \(1, 3\), got \(3,\)"):
        das.fit_many(forward, h, target, weight=torch.ones(3))


# ---------------------------------------------------------------------------------- DAS: k-dimensional subspaces


def _plane_model(n: int = 256, d: int = 8, seed: int = 0):
    """A linear 'LM' reading a 2-D variable z that lives in the known plane span U (d, 2): z takes 4 values, the
    corners 2·(±1, ±1), and the logits are ⟨Uᵀh, c_j⟩ for the 4 corners c_j. Base and source rows carry independent
    values plus noise (sd 3) outside the plane, so the subspace that moves z and nothing else is span U exactly: a
    1-D interchange moves one coordinate of z (it gets the source's value only where the other one agrees already)."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(d, 2, generator=g))
    C = 2.0 * torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    zb, zs = torch.randint(0, 4, (n,), generator=g), torch.randint(0, 4, (n,), generator=g)
    off = torch.eye(d) - U @ U.T
    h_base = C[zb] @ U.T + 3 * torch.randn(n, d, generator=g) @ off
    h_source = C[zs] @ U.T + 3 * torch.randn(n, d, generator=g) @ off

    def forward(edit: Edit, idx: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax((edit(h_base[idx]) @ U) @ C.T, -1)

    return U, forward, h_source, zs


def test_k_dimensional_das_recovers_a_planted_plane_that_one_direction_cannot_carry() -> None:
    from cprobe.directions.das import subspace_edit

    U, forward, h_source, target = _plane_model()
    everyone = torch.arange(len(target))
    settings = dict(seed=0, lr=0.1, batch_size=32, epochs=10)

    def accuracy(basis: torch.Tensor) -> float:
        return float((forward(subspace_edit(h_source, basis), everyone).argmax(-1) == target).float().mean())

    one = DAS(**settings).fit(forward, h_source, target)
    two = DAS(k=2, **settings).fit(forward, h_source, target)
    assert one.basis_.shape == (8, 1) and torch.equal(one.basis_[:, 0], one.a)
    assert two.basis_.shape == (8, 2) and torch.equal(two.basis_[:, 0], two.a)
    # orthonormal after training, and the plane found: the cosines of both principal angles near 1 (measured ≥ 0.993)
    torch.testing.assert_close(two.basis_.T @ two.basis_, torch.eye(2), atol=1e-5, rtol=0)
    assert float(torch.linalg.svdvals(U.T @ two.basis_).min()) > 0.98
    assert accuracy(two.basis_) > 0.99
    assert accuracy(one.a) < 0.75  # measured 0.58: one coordinate of z moves, the other agrees half the time
    assert two.losses[-1] < 0.1 * one.losses[-1]


def test_k_equal_to_d_interchanges_the_whole_source_vector() -> None:
    from cprobe.directions.das import subspace_edit
    from cprobe.models.multisite import rowwise_dii

    g = torch.Generator().manual_seed(1)
    h, s = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    R, _ = torch.linalg.qr(torch.randn(4, 4, generator=g))
    torch.testing.assert_close(subspace_edit(s, R)(h), s, atol=1e-6, rtol=0)
    torch.testing.assert_close(rowwise_dii(s, R.expand(5, 4, 4))(h), s, atol=1e-6, rtol=0)
    _, forward, h_source, target = _plane_model(n=16, d=4)
    das = DAS(k=4, seed=3, epochs=1, batch_size=8).fit(forward, h_source, target)
    torch.testing.assert_close(subspace_edit(s, das.basis_)(h), s, atol=1e-5, rtol=0)


def test_k_dimensional_householder_is_torchs_orthogonal_parametrisation_of_a_d_by_k_weight() -> None:
    """pyvene's ``LowRankRotateLayer(d, k)`` under torch's ``orthogonal``: the batched bases equal its weight at any
    value of the trained parameter; the start's first column is the 1-D start."""
    d, K, k = 10, 2, 3
    das = DAS(seed=7, k=k)
    bases, (X,) = das._parametrise(K, d, torch.device("cpu"))
    init, base = das.start(d)
    torch.testing.assert_close(init[:, 0], DAS(seed=7).start(d)[0])
    torch.testing.assert_close(init.T @ init, torch.eye(k), atol=1e-6, rtol=0)
    torch.testing.assert_close(bases()[1], init, atol=1e-6, rtol=0)  # starts at the seeded start
    with torch.no_grad():
        X += 0.3 * torch.randn(K, d, k, generator=torch.Generator().manual_seed(1))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        rotate = torch.nn.Linear(k, d, bias=False)
        with torch.no_grad():
            rotate.weight.copy_(init)
        torch.nn.utils.parametrizations.orthogonal(rotate)
    torch.testing.assert_close(rotate.parametrizations.weight[0].base, base)
    for i in range(K):
        with torch.no_grad():
            rotate.parametrizations.weight.original.copy_(X[i])
        torch.testing.assert_close(bases()[i], rotate.weight.detach(), atol=1e-6, rtol=0)


def test_k_dimensional_fit_many_equals_one_site_at_a_time() -> None:
    from cprobe.directions.das import subspace_edit

    _, forward, h_source, target = _plane_model(n=64)
    H, T = torch.stack([h_source, h_source.flip(0)]), torch.stack([target, target.flip(0)])

    def many(rows, hs, R):
        assert R.shape == (2, 8, 2)
        idx = torch.arange(rows.start, rows.stop)
        return torch.stack([forward(subspace_edit(hs[i], R[i]), idx) for i in range(len(R))])

    batched = DAS(k=2, seed=1, epochs=2, batch_size=16)
    B = batched.fit_many(many, H, T)
    assert B.shape == (2, 8, 2)
    for i in range(2):
        one = DAS(k=2, seed=1, epochs=2, batch_size=16).fit(forward, H[i], T[i])
        torch.testing.assert_close(B[i], one.basis_, atol=1e-5, rtol=0)


def test_das_k_is_checked() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k"):
            DAS(k=bad)
    with pytest.raises(ValueError, match="orthogonal"):
        DAS(k=2, parametrization="normalize")
    with pytest.raises(ValueError, match="exceeds"):
        DAS(k=5).fit_many(lambda r, h, a: None, torch.zeros(1, 4, 4), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(NotFittedError):
        DAS(k=2).basis_
