"""R-LACE: the Fantope projection, the exact low-rank game state, the fresh selection probe, and erasure
checked by an independent adversary (scikit-learn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from cprobe.errors import ConfigError
from cprobe.interventions.rlace import RLACE, LowRankFantope, fantope_shift
from tests.unit.test_inlp import gaussian_classes, linear_accuracy


def project_fantope(A: torch.Tensor, rank: int) -> torch.Tensor:
    """Euclidean projection of a symmetric matrix onto {0 ⪯ P ⪯ I, tr P = rank}: eigenvalues λ ↦ clip(λ − θ, 0, 1)."""
    lam, V = torch.linalg.eigh((A + A.T) / 2)
    clipped = (lam - fantope_shift(lam, rank)).clamp(0, 1)
    return (V * clipped) @ V.T


def test_fantope_projection() -> None:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(8, 8, generator=g)
    F = project_fantope(A + A.T, 3)
    lam = torch.linalg.eigvalsh(F)
    assert torch.trace(F).item() == pytest.approx(3.0, abs=1e-4)
    assert lam.min() > -1e-5 and lam.max() < 1 + 1e-5
    E = torch.diag(torch.tensor([1.0, 1.0, 1.0, 0, 0, 0, 0, 0]))  # already in the Fantope
    assert torch.allclose(project_fantope(E, 3), E, atol=1e-5)


def test_fantope_shift_hand_computed() -> None:
    """λ = (1.2, 0.6, −1), rank 1: (1.2 − θ) + (0.6 − θ) = 1 ⇒ θ = 0.4 (eigenvalues 0.8, 0.2, 0)."""
    assert fantope_shift(torch.tensor([1.2, 0.6, -1.0], dtype=torch.float64), 1).item() == pytest.approx(0.4, abs=1e-9)
    # one eigenvalue 1.5 and three equal to 0.4, rank 2: clip(1.5 − θ) = 1, so 3(0.4 − θ) = 1
    lam, extra = torch.tensor([1.5], dtype=torch.float64), torch.tensor(0.4, dtype=torch.float64)
    theta = fantope_shift(lam, 2, extra=extra, n_extra=3)
    assert ((lam - theta).clamp(0, 1).sum() + 3 * (extra - theta).clamp(0, 1)).item() == pytest.approx(2.0)
    assert theta.item() == pytest.approx(0.4 - 1 / 3)  # 1 + 3(0.4 − θ) = 2


@pytest.mark.parametrize("rank", [1, 3])
def test_low_rank_state_follows_the_dense_game(rank: int) -> None:
    """c·I + V diag(m) Vᵀ stepped with rank-1 gradients equals the dense SGD-then-project iterates."""
    g = torch.Generator().manual_seed(rank)
    d = 20
    P0 = 0.1 * torch.randn(d, d, generator=g, dtype=torch.float64)
    P0 = (P0 + P0.T) / 2
    state, dense = LowRankFantope(P0, rank), project_fantope(P0, rank)
    assert torch.allclose(state.dense(), dense, atol=1e-12)
    for _ in range(40):
        A, B = torch.randn(d, 1, generator=g, dtype=torch.float64), torch.randn(d, 1, generator=g, dtype=torch.float64)
        state.sgd_step(A, B, lr=0.05, weight_decay=0.01)
        G = dense - 0.05 * (A @ B.T + 0.01 * dense)
        dense = project_fantope((G + G.T) / 2, rank)
        X = torch.randn(5, d, generator=g, dtype=torch.float64)
        assert torch.allclose(state.erase(X), X @ (torch.eye(d, dtype=torch.float64) - dense), atol=1e-10)
    assert torch.allclose(state.dense(), dense, atol=1e-10)
    assert state.V.shape[1] < d  # the state stays low-rank


def test_selection_probe_is_the_regularised_optimum() -> None:
    """The fresh probe that scores each rounding is the exact optimum of the reference's probe objective
    (SGDClassifier(alpha=1e-4): mean log-loss + alpha/2 ‖w‖²), i.e. LogisticRegression(C = 1/(alpha·n))."""
    X, z = gaussian_classes(400, 10, sep=5.0)  # nearly separable: a few solver steps are far from the optimum
    rl = RLACE(1)
    U = torch.nn.functional.normalize(torch.randn(10, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), dim=0)
    loss, acc, _ = rl._score(X.double(), z, 2, U, None)
    Xe = (X.double() - (X.double() @ U) @ U.T).numpy()
    clf = LogisticRegression(C=1 / (1e-4 * 400), tol=1e-12, max_iter=100_000).fit(Xe, z.numpy())
    p = clf.predict_proba(Xe)[np.arange(400), z.numpy()]
    assert loss == pytest.approx(float(-np.log(p).mean()), abs=1e-6)
    assert acc == pytest.approx(clf.score(Xe, z.numpy()))


def test_projection_and_erasure() -> None:
    X, z = gaussian_classes(1200, 12)
    tr, te = slice(0, 600), slice(600, None)
    assert linear_accuracy(X[tr], z[tr], X[te], z[te], 2) > 0.95
    rlace = RLACE(1, lr=0.05, max_steps=3000, seed=0).fit(X[tr], z[tr])  # 10x the paper lr: converges fast
    assert rlace.converged and rlace.steps_run < 3000
    P = rlace.P
    assert torch.allclose(P, P.T, atol=1e-5)
    assert torch.allclose(P @ P, P, atol=1e-5)
    assert torch.linalg.matrix_rank(P).item() == 11
    Xp = rlace.transform(X)
    assert linear_accuracy(Xp[tr], z[tr], Xp[te], z[te], 2) < 0.6  # balanced classes: majority rate 0.5


def test_multiclass_game_runs_and_erases() -> None:
    X, z = gaussian_classes(900, 10, k=3)
    rl = RLACE(2, lr=0.05, max_steps=3000).fit(X, z)
    assert torch.linalg.matrix_rank(rl.P).item() == 8
    Xp = rl.transform(X)
    assert linear_accuracy(Xp[:450], z[:450], Xp[450:], z[450:], 3) < linear_accuracy(X[:450], z[:450], X[450:], z[450:], 3)


def test_seed_reproducible_and_rank_zero() -> None:
    X, z = gaussian_classes(300, 6)
    a = RLACE(1, max_steps=300, seed=1).fit(X, z).P
    assert torch.equal(a, RLACE(1, max_steps=300, seed=1).fit(X, z).P)
    assert torch.equal(RLACE(0).fit(X, z).transform(X), X)


def test_bad_hyperparameters() -> None:
    X, z = gaussian_classes(50, 4)
    with pytest.raises(ConfigError, match="exceeds the embedding size 4"):
        RLACE(5).fit(X, z)
    with pytest.raises(ConfigError, match="lr"):
        RLACE(1, lr=-0.1)
    with pytest.raises(ConfigError, match="eval_every"):
        RLACE(1, eval_every=0)


@pytest.mark.parametrize("k", [2, 3])
def test_gradient_and_predictor_step_equal_autograd_and_torch_sgd(k: int) -> None:
    """A Bᵀ = ∂(−loss)/∂P of the predictor's loss on X(I − P); the predictor step = torch SGD with weight decay."""
    g = torch.Generator().manual_seed(k)
    d, n = 7, 16
    xb = torch.randn(n, d, generator=g, dtype=torch.float64)
    yb = torch.randint(0, k, (n,), generator=g)
    rows = 1 if k == 2 else k
    W, b = torch.randn(rows, d, generator=g, dtype=torch.float64), torch.randn(rows, generator=g, dtype=torch.float64)
    P0 = 0.1 * torch.randn(d, d, generator=g, dtype=torch.float64)
    P0 = (P0 + P0.T) / 2
    state = LowRankFantope(P0, 2)
    P = state.dense().clone().requires_grad_(True)
    logits = (xb - xb @ P) @ W.T + b
    loss_fn = torch.nn.BCEWithLogitsLoss() if k == 2 else torch.nn.CrossEntropyLoss()
    target = yb.double() if k == 2 else yb
    (grad,) = torch.autograd.grad(-loss_fn(logits[:, 0] if k == 2 else logits, target), P)
    A, B = RLACE._gradient(W, b, xb, state.erase(xb), target, k == 2)
    assert torch.allclose(A @ B.T, grad, atol=1e-12)

    lin = torch.nn.Linear(d, rows).double()
    with torch.no_grad():
        lin.weight.copy_(W)
        lin.bias.copy_(b)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, weight_decay=0.01)
    out = lin(state.erase(xb))
    loss_fn(out[:, 0] if k == 2 else out, target).backward()
    opt.step()
    RLACE(1, lr=0.1, weight_decay=0.01)._predictor_step(W, b, state, xb, target, k == 2)
    assert torch.allclose(W, lin.weight, atol=1e-12) and torch.allclose(b, lin.bias, atol=1e-12)


def test_reference_restatement_projects_eigenvalues_like_cprobe() -> None:
    from cprobe.bench.reference import _fantope_eigenvalues

    lam = torch.tensor([1.2, 0.6, -1.0, 0.3], dtype=torch.float64)
    ours = (lam - fantope_shift(lam, 1)).clamp(0, 1).numpy()
    assert np.allclose(_fantope_eigenvalues(lam.numpy(), 1, iters=60), ours, atol=1e-9)


# ------------------------------------------------------------------------------------- stopping and warm starts
def test_plateau_rule_on_hand_made_loss_sequences() -> None:
    """(step, best loss so far) at each evaluation; patience 2000 steps, tolerance 1e-3."""
    from cprobe.interventions.rlace import plateaued

    rising = [(1, 0.10), (1001, 0.30), (2001, 0.50), (3001, 0.60)]
    assert not plateaued(rising[:2], 2000, 1e-3)  # no evaluation 2000 steps before the last yet
    assert not plateaued(rising, 2000, 1e-3)  # 0.60 − 0.30 (the best at step 1001 = 3001 − 2000)
    flat = [(1, 0.10), (1001, 0.6900), (2001, 0.6905), (3001, 0.6909)]
    assert plateaued(flat, 2000, 1e-3)  # 0.6909 − 0.6900 < 1e-3
    assert not plateaued(flat, 2000, 1e-4)  # 9e-4 is not below 1e-4
    assert not plateaued(flat, 3001, 1e-3)  # nothing 3001 steps before step 3001
    assert plateaued(flat, 3000, 1e-3) is False  # the best at step 1 (0.10): still rising over 3000 steps
    # the window reaches back to the latest evaluation at least `patience` steps before the last, not the first one
    uneven = [(1, 0.1), (500, 0.6), (1800, 0.6), (2600, 0.6004)]
    assert plateaued(uneven, 2000, 1e-3)  # compares 0.6004 with the best at step 500 (2600 − 2000 = 600 ≥ 500)
    assert not plateaued([], 2000, 1e-3)


def test_stop_reasons(tmp_path) -> None:
    """eps: the fresh probe reaches the majority rate; plateau: the best loss stops rising; cap: neither in time."""
    X, z = gaussian_classes(600, 12)
    eps = RLACE(1, lr=0.05, max_steps=3000).fit(X, z)
    assert eps.stop_reason == "eps" and eps.converged and eps.steps_run < 3000
    cap = RLACE(1, max_steps=150).fit(X, z)  # the paper's lr: far from erasing after 150 steps
    assert cap.stop_reason == "cap" and not cap.converged and cap.steps_run == 150
    flat = RLACE(1, lr=0.05, max_steps=3000, epsilon=0.0, patience=300, plateau_tol=1e9).fit(X, z)
    assert flat.stop_reason == "plateau" and not flat.converged
    assert flat.steps_run == 301  # the first evaluation 300 steps after another: steps 1, 101, 201, 301
    assert RLACE(0).fit(X, z).stop_reason == "none"


def test_plateau_stop_keeps_the_erasure_in_fewer_steps() -> None:
    """On a game that never reaches ε (ε = 0), a plateau stop ends it long before the cap, with the kept projection
    erasing as well (an independent adversary within two points of the capped game's)."""
    X, z = gaussian_classes(1200, 12)
    tr, te = slice(0, 600), slice(600, None)
    capped = RLACE(1, lr=0.05, max_steps=4000, epsilon=0.0).fit(X[tr], z[tr])
    early = RLACE(1, lr=0.05, max_steps=4000, epsilon=0.0, patience=1000, plateau_tol=1e-4).fit(X[tr], z[tr])
    assert capped.stop_reason == "cap" and early.stop_reason == "plateau" and early.steps_run < 3000
    acc = [linear_accuracy((X @ m.P)[tr], z[tr], (X @ m.P)[te], z[te], 2) for m in (capped, early)]
    assert acc[1] < 0.6 and abs(acc[0] - acc[1]) <= 0.02, acc


def test_extend_adds_the_directions_p_weighs_most_outside_u() -> None:
    """U = e₀; P = diag(0.9, 0.05, 0.5, 0.1) rotated: outside e₀ the heaviest direction is e₂ (0.5), then e₃ (0.1)."""
    from cprobe.interventions.rlace import extend

    P = torch.diag(torch.tensor([0.9, 0.05, 0.5, 0.1], dtype=torch.float64))
    e = torch.eye(4, dtype=torch.float64)
    E = extend(e[:, :1], P, 2)
    assert torch.equal(E[:, 0], e[:, 0]) and torch.allclose(E[:, 1].abs(), e[:, 2])
    E3 = extend(e[:, :1], P, 3)
    assert {int(E3[:, j].abs().argmax()) for j in (1, 2)} == {2, 3}
    assert torch.allclose(E3.T @ E3, torch.eye(3, dtype=torch.float64), atol=1e-12)
    Q = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    R = extend(Q[:, :1], Q @ P @ Q.T, 2)  # the same, in another basis
    assert torch.allclose((R[:, 1] @ Q[:, 2]).abs(), torch.tensor(1.0, dtype=torch.float64))


def test_warm_start_continues_a_lower_rank_game() -> None:
    """Rank 2 from rank 1's game: P starts on the rank-2 Fantope, the first candidate keeps rank 1's direction, and the
    game reaches the majority rate (ε) in fewer steps than from the random start, erasing at least as well (an
    independent adversary within two points). Rank 1 cannot reach ε on three classes: 1,500 steps of it are the start
    (here cold took 3,801 steps and warm 1,001)."""
    X, z = gaussian_classes(600, 12, k=3)
    tr, te = slice(0, 300), slice(300, None)
    one = RLACE(1, lr=0.05, max_steps=1500).fit(X[tr], z[tr])
    assert one.game_.rank == 1 and torch.trace(one.game_.P).item() == pytest.approx(1.0, abs=1e-9)
    cold = RLACE(2, lr=0.05, max_steps=6000).fit(X[tr], z[tr])
    warm = RLACE(2, lr=0.05, max_steps=6000).fit(X[tr], z[tr], start=one.game_)
    assert warm.start_rank == 1 and cold.start_rank is None
    assert torch.linalg.matrix_rank(warm.P).item() == 10
    assert warm.converged and warm.steps_run < cold.steps_run, (warm.steps_run, cold.steps_run)
    acc = [linear_accuracy((X @ m.P)[tr], z[tr], (X @ m.P)[te], z[te], 3) for m in (cold, warm)]
    assert acc[1] <= acc[0] + 0.02, acc
    with pytest.raises(ConfigError, match="lower rank on 8-dimensional states"):
        RLACE(2).fit(X[:, :8], z, start=one.game_)


def test_rank_chain_is_the_same_cached_or_not(tmp_path, monkeypatch) -> None:
    """warm_start: rank r is the last game of the chain 1 → … → r, read from the cache (kind rlace) where a job
    before played it; the same projection whether the links were cached, played in this process, or asked in another
    order."""
    from cprobe.interventions import rlace_chain

    X, z = gaussian_classes(400, 10, k=3)
    kw = dict(lr=0.05, max_steps=600, warm_start=True)
    monkeypatch.setenv("CPROBE_CACHE_DIR", str(tmp_path))
    played: list[int] = []
    real = RLACE._play

    def counting(self, Xd, zd, k, rank, start):
        played.append(rank)
        return real(self, Xd, zd, k, rank, start)

    monkeypatch.setattr(RLACE, "_play", counting)
    three = RLACE(3, **kw).fit(X, z)
    assert played == [1, 2, 3] and three.start_rank == 2
    assert sorted(p.name.split("-")[-1] for p in (tmp_path / "rlace").iterdir() if p.is_dir()) == \
        ["rank1", "rank2", "rank3"]
    played.clear()
    assert torch.equal(RLACE(2, **kw).fit(X, z).P, RLACE(2, **kw, cache=False).fit(X, z).P)
    assert played == [1, 2]  # rank 2 read from the cache, then played here without it
    played.clear()
    four = RLACE(4, **kw).fit(X, z)
    assert played == [4] and four.start_rank == 3  # continues from the cached rank 3
    again = RLACE(3, **kw).fit(X, z)
    assert torch.equal(again.P, three.P) and (again.steps_run, again.stop_reason) == (three.steps_run,
                                                                                       three.stop_reason)
    other = RLACE(3, **{**kw, "lr": 0.04}).fit(X, z)  # another setting: another chain
    assert played == [4, 1, 2, 3] and not torch.equal(other.P, three.P)
    assert rlace_chain.key(X, z, RLACE(3).settings()) != rlace_chain.key(X, 1 - z.clamp(max=1), RLACE(3).settings())


def test_a_rank_chain_s_key_covers_every_row_label_and_setting() -> None:
    """One changed state, one changed label or one changed setting names another chain: the cache never answers
    for games played on other data or settings."""
    from cprobe.interventions.rlace_chain import key

    X, z = gaussian_classes(50, 6, k=2)
    settings = RLACE(1).settings()
    base = key(X, z, settings)
    X2 = X.clone()
    X2[17, 3] += 1e-3
    z2 = z.clone()
    z2[5] = 1 - z2[5]
    assert key(X.clone(), z.clone(), dict(settings)) == base
    assert len({base, key(X2, z, settings), key(X, z2, settings), key(X, z, {**settings, "seed": 1}),
                key(X, z, {**settings, "patience": 5000}), key(X[:, :5], z, settings)}) == 6
