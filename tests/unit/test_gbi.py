"""Gradient-based interventions: eps-ball, no [0, 1] clamp, targeted success, exact FGSM step."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError
from cprobe.interventions.autoattack import COMPONENTS, AutoAttack, square_p, targeted_dlr
from cprobe.interventions.base import INTERVENTIONS
from cprobe.interventions.fgsm import FGSM
from cprobe.interventions.gbi import GradientIntervention, input_grad, project_linf, target_margin, targeted_ce
from cprobe.interventions.pgd import PGD
from cprobe.probes.base import Probe

Factory = Callable[..., GradientIntervention]

# make(module, n_classes, eps=..., **kw); small budgets keep the file fast, same algorithms.
SMALL = {"n_iter": 30, "n_queries": 300}
ATTACKS: dict[str, Factory] = {
    "fgsm": lambda m, k, **kw: FGSM.from_module(m, k, **kw),
    "pgd": lambda m, k, **kw: PGD.from_module(m, k, steps=20, **kw),
    **{
        name: (lambda m, k, name=name, **kw: AutoAttack.from_module(m, k, attacks=(name,), **SMALL, **kw))
        for name in COMPONENTS
    },
    "autoattack": lambda m, k, **kw: AutoAttack.from_module(m, k, **SMALL, **kw),
}


def mlp(d: int, k: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, k))


def blobs(n: int, d: int, k: int, seed: int = 0) -> tuple[Tensor, Tensor, nn.Module, Tensor]:
    """Separable clusters at +-1 corners, a linear probe that knows them, and targets z' != z."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randint(0, 2, (k, d), generator=g).float() * 2 - 1
    z = torch.arange(n) % k
    X = centres[z] + 0.1 * torch.randn(n, d, generator=g)
    lin = nn.Linear(d, k)
    with torch.no_grad():
        lin.weight.copy_(centres)
        lin.bias.zero_()
    z_target = (z + 1 + torch.randint(0, k - 1, (n,), generator=g)) % k
    return X, z, lin, z_target


def success(iv: GradientIntervention, X: Tensor, z_target: Tensor) -> float:
    assert iv.module_ is not None
    with torch.no_grad():
        return (iv.module_(iv.transform(X, z_target)).argmax(1) == z_target).float().mean().item()


@pytest.mark.parametrize("name", ATTACKS)
@pytest.mark.parametrize("eps", [3.0, 1e-3])
def test_stays_in_linf_ball_far_from_unit_box(name: str, eps: float) -> None:
    g = torch.Generator().manual_seed(1)
    X = 40 * torch.randn(48, 12, generator=g) + 30  # mostly far outside [0, 1]
    z_target = torch.randint(0, 4, (48,), generator=g)
    iv = ATTACKS[name](mlp(12, 4), 4, eps=eps)
    X0 = X.clone()
    out = iv.transform(X, z_target)
    assert torch.equal(X, X0)  # never in place
    assert out.shape == X.shape and out.dtype == X.dtype
    assert (out - X).abs().max().item() <= eps + 1e-6


@pytest.mark.parametrize("name", ATTACKS)
def test_no_unit_box_clamp_target_beyond_one_is_reachable(name: str) -> None:
    # Class 1 iff h_0 > 1.2; rows start at h_0 in [0.95, 1.1]. A [0, 1] clamp could never
    # reach the target; the eps-ball alone (eps = 0.3) always can.
    g = torch.Generator().manual_seed(2)
    X = torch.randn(40, 8, generator=g)
    X[:, 0] = 0.95 + 0.15 * torch.rand(40, generator=g)
    lin = nn.Linear(8, 2)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[1, 0] = 5.0
        lin.bias.copy_(torch.tensor([0.0, -6.0]))
    iv = ATTACKS[name](lin, 2, eps=0.3)
    out = iv.transform(X, torch.ones(40, dtype=torch.long))
    assert (out[:, 0] > 1.2).all()
    assert (out - X).abs().max().item() <= 0.3 + 1e-6


@pytest.mark.parametrize("name", ATTACKS)
def test_targeted_success_big_vs_tiny_eps(name: str) -> None:
    # FGSM's single sign step can overshoot into a third class (15/16 reach z' here); the
    # iterative attacks reach all.
    X, _, lin, z_target = blobs(64, 10, 4)
    assert success(ATTACKS[name](lin, 4, eps=3.0), X, z_target) >= (0.9 if name == "fgsm" else 1.0)
    assert success(ATTACKS[name](lin, 4, eps=1e-3), X, z_target) <= 0.05


def test_pgd_success_non_decreasing_in_eps() -> None:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(200, 16, generator=g)
    module = mlp(16, 3, seed=3)
    with torch.no_grad():
        z_target = (module(X).argmax(1) + 1) % 3
    eps_grid = (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)
    rates = [success(PGD.from_module(module, 3, eps=eps), X, z_target) for eps in eps_grid]
    assert rates[0] < 0.5 < rates[-1]  # the sweep spans the transition, so the check has teeth
    assert all(b >= a - 0.02 for a, b in zip(rates, rates[1:])), rates


def test_fgsm_matches_hand_computed_step() -> None:
    # Two classes, logits W h: grad_h CE(., 1) = p_0 (W_0 - W_1), so h' = h + eps sign(W_1 - W_0).
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -2.0], [0.0, 3.0]]))
    X = torch.tensor([[0.5, 7.0], [-3.0, 2.0]])
    out = FGSM.from_module(lin, 2, eps=0.25).transform(X, torch.tensor([1, 1]))
    torch.testing.assert_close(out, X + 0.25 * torch.tensor([-1.0, 1.0]))


def test_fgsm_matches_softmax_gradient_formula() -> None:
    # Linear logits W h + b: grad_h CE(., t) = W^T (softmax - onehot_t), written out by hand.
    X, _, lin, z_target = blobs(16, 6, 3)
    p = torch.softmax(X @ lin.weight.detach().T + lin.bias.detach(), 1)
    grad = (p - nn.functional.one_hot(z_target, 3)) @ lin.weight.detach()
    out = FGSM.from_module(lin, 3, eps=0.1).transform(X, z_target)
    torch.testing.assert_close(out, X - 0.1 * grad.sign())


def test_pgd_one_full_step_from_centre_equals_fgsm_on_binary_linear() -> None:
    # For k = 2 and linear logits the CE falls monotonically along the FGSM direction, so the
    # best of {h, h - eps sign(grad)} is the FGSM point.
    X, _, lin, z_target = blobs(32, 5, 2)
    pgd = PGD.from_module(lin, 2, eps=0.4, steps=1, step_size=0.4, random_start=False)
    fgsm = FGSM.from_module(lin, 2, eps=0.4)
    torch.testing.assert_close(pgd.transform(X, z_target), fgsm.transform(X, z_target))


@pytest.mark.parametrize("name", ["pgd", "apgd-ce", "square", "autoattack"])
def test_deterministic_given_seed(name: str) -> None:
    g = torch.Generator().manual_seed(4)
    X, z_target = torch.randn(30, 8, generator=g), torch.randint(0, 3, (30,), generator=g)
    module = mlp(8, 3)
    a = ATTACKS[name](module, 3, eps=0.05).transform(X, z_target)
    b = ATTACKS[name](module, 3, eps=0.05).transform(X, z_target)
    c = ATTACKS[name](module, 3, eps=0.05, seed=1).transform(X, z_target)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.numeric
def test_batches_do_not_change_deterministic_attacks() -> None:
    """Each row is attacked on its own: batches of 7 give every row its unbatched attack. A sign step is discontinuous
    where a gradient coordinate is 0, and there the sign of the rounding noise decides (the matmul kernel differs by
    batch shape and CPU), so the iterates are compared on a probe with generic weights and an unsaturated softmax,
    where every gradient coordinate is far from cancelling (checked along the path)."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(50, 6, generator=g)
    lin = nn.Linear(6, 3)
    with torch.no_grad():
        lin.weight.copy_(0.5 * torch.randn(3, 6, generator=g))
        lin.bias.zero_()
    z_target = torch.randint(0, 3, (50,), generator=g)
    kw = dict(eps=0.3, steps=5, random_start=False)
    full = PGD.from_module(lin, 3, **kw).transform(X, z_target)
    batched = PGD.from_module(lin, 3, batch_size=7, **kw).transform(X, z_target)
    x = X  # the path, by hand: each coordinate's sum over classes keeps > 1e-3 of its terms' size (noise: ~1e-7)
    for _ in range(5):
        _, grad, logits = input_grad(lin, x, targeted_ce, z_target)
        residual = logits.softmax(1) - nn.functional.one_hot(z_target, 3)
        assert (grad.abs() / (residual.abs() @ lin.weight.detach().abs())).min().item() > 1e-3
        x = project_linf(x - 2.5 * 0.3 / 5 * grad.sign(), X, 0.3)
    torch.testing.assert_close(full, x)
    torch.testing.assert_close(batched, full)


@pytest.mark.numeric
def test_batches_keep_each_rows_attack_where_a_gradient_coordinate_is_tied() -> None:
    """The blobs' probe has a coordinate that every class weighs alike (+1): its CE gradient is exactly 0, the rounded
    sign is float noise, and the attack moves it by ±eps or not at all depending on the batch shape and the CPU. That
    coordinate changes no class's probability, so what batching promises still holds: each row's success, its class
    log-probabilities and the eps-ball."""
    X, _, lin, z_target = blobs(50, 6, 3)
    assert (lin.weight == lin.weight[0]).all(0).any()  # a tied coordinate
    full = PGD.from_module(lin, 3, eps=1.0, random_start=False).transform(X, z_target)
    batched = PGD.from_module(lin, 3, eps=1.0, random_start=False, batch_size=7).transform(X, z_target)
    with torch.no_grad():
        lp_full, lp_batched = lin(full).log_softmax(1), lin(batched).log_softmax(1)
    hit = lp_full.argmax(1) == z_target
    assert 0 < hit.float().mean() < 1 and torch.equal(lp_batched.argmax(1) == z_target, hit)
    torch.testing.assert_close(lp_batched, lp_full)
    for out in (full, batched):
        assert (out - X).abs().max() <= 1.0 + 1e-6


def test_ensemble_is_at_least_as_successful_as_apgd_ce_alone() -> None:
    g = torch.Generator().manual_seed(5)
    X = torch.randn(120, 16, generator=g)
    module = mlp(16, 4, seed=5)
    with torch.no_grad():
        z_target = (module(X).argmax(1) + 2) % 4
    kw = dict(eps=0.08, n_iter=20, n_queries=200)
    alone = success(AutoAttack.from_module(module, 4, attacks=("apgd-ce",), **kw), X, z_target)
    ens = success(AutoAttack.from_module(module, 4, **kw), X, z_target)
    assert 0 < alone < 1  # later components have rows left to work on
    assert ens >= alone


def test_project_linf_is_exact_for_large_coordinates() -> None:
    # float32 ulp at 3000 is 2.4e-4, far above eps: a plain h + clamp(x - h) overshoots.
    g = torch.Generator().manual_seed(6)
    h = 3000 + torch.randn(200, 50, generator=g)
    x = h + torch.randn(200, 50, generator=g)
    eps = 1.4e-3  # 5.7 ulps: h + eps rounds up to 6 ulps
    assert ((h + (x - h).clamp(-eps, eps)) - h).abs().max() > eps  # the naive way fails here
    assert (project_linf(x, h, eps) - h).abs().max() <= eps
    inside = h + 0.5 * eps * torch.rand(200, 50, generator=g).sign()
    torch.testing.assert_close(project_linf(inside, h, eps), inside, rtol=0, atol=3e-4)


def test_target_margin_and_targeted_dlr_hand_values() -> None:
    logits = torch.tensor([[4.0, 1.0, 0.0, -2.0, 3.0]])
    t = torch.tensor([1])
    assert target_margin(logits, t).item() == pytest.approx(1.0 - 4.0)
    # sorted: 4, 3, 1, 0, -2 -> denominator 4 - (1 + 0) / 2 = 3.5
    assert targeted_dlr(logits, t).item() == pytest.approx(-3.0 / 3.5)
    # k = 2: DLR would be +-1 with zero gradient; the fallback is the plain margin.
    two = torch.tensor([[2.0, -0.5]])
    assert targeted_dlr(two, torch.tensor([1])).item() == pytest.approx(-2.5)


def test_square_schedule_hand_values() -> None:
    assert square_p(0.8, 0, 5000) == pytest.approx(0.8)
    assert square_p(0.8, 10, 5000) == pytest.approx(0.4)  # query 20 of 10k scale
    assert square_p(0.8, 2500, 5000) == pytest.approx(0.8 / 128)  # query 5000 of 10k scale
    assert square_p(0.8, 4999, 5000) == pytest.approx(0.8 / 512)


def test_use_probe_and_fit_share_the_interventional_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    X, z, lin, z_target = blobs(40, 6, 3)

    class Fixed(Probe):
        def __init__(self, cfg: dict) -> None:
            self.cfg, self.n_classes = cfg, 3

        def fit(self, X: Tensor, y: Tensor, X_val: Tensor | None = None, y_val: Tensor | None = None):
            self.module, self.seen = lin, (X, y)
            return self

    built: list[Fixed] = []

    def build_probe(cfg: dict) -> Fixed:
        built.append(Fixed(cfg))
        return built[-1]

    import cprobe.probes

    monkeypatch.setattr(cprobe.probes, "build_probe", build_probe, raising=False)
    fitted = FGSM(0.2, probe={"name": "mlp", "hidden": 8}).fit(X, z)
    assert built[0].cfg == {"name": "mlp", "hidden": 8} and built[0].seen[0] is X
    shared = PGD(0.2, random_start=False, steps=1, step_size=0.2).use_probe(built[0])
    expected = FGSM.from_module(lin, 3, eps=0.2).transform(X, z_target)
    torch.testing.assert_close(fitted.transform(X, z_target), expected)
    assert shared.n_classes_ == 3 and shared.module_ is not lin
    torch.testing.assert_close(shared.module_(X), lin(X))
    assert lin.weight.requires_grad  # the caller's probe is untouched (the attack uses a frozen copy)


def test_float64_input_keeps_dtype_and_ball() -> None:
    X, _, lin, z_target = blobs(20, 6, 3)
    out = PGD.from_module(lin, 3, eps=0.05).transform(X.double(), z_target)
    assert out.dtype == torch.float64
    assert (out - X.double()).abs().max().item() <= 0.05


@pytest.mark.parametrize("cls", [FGSM, PGD, AutoAttack])
@pytest.mark.parametrize("eps", [0, -0.1, math.nan, math.inf, "0.1"])
def test_bad_eps_raises(cls: type[GradientIntervention], eps: object) -> None:
    with pytest.raises(ConfigError, match="eps"):
        cls(eps)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: PGD(0.1, steps=0),
        lambda: PGD(0.1, step_size=-1.0),
        lambda: AutoAttack(0.1, attacks=("apgd-ce", "pgd")),
        lambda: AutoAttack(0.1, attacks=()),
        lambda: AutoAttack(0.1, n_queries=0),
        lambda: FGSM(0.1, batch_size=0),
        lambda: FGSM.from_module(nn.Linear(3, 1), 1, eps=0.1),
    ],
)
def test_bad_hyperparameters_raise(make: Callable[[], object]) -> None:
    with pytest.raises(ConfigError):
        make()


def test_transform_input_errors() -> None:
    iv = FGSM.from_module(nn.Linear(4, 3), 3, eps=0.1)
    X = torch.randn(5, 4)
    with pytest.raises(ConfigError, match="z_target"):
        iv.transform(X)
    with pytest.raises(ConfigError, match="z_target"):
        iv.transform(X, torch.tensor([0, 1, 2, 3, 0]))
    with pytest.raises(ConfigError, match="shape"):
        iv.transform(X, torch.zeros(4, dtype=torch.long))
    from cprobe.errors import NotFittedError

    with pytest.raises(NotFittedError, match="not fitted"):
        FGSM(0.1).transform(X, torch.zeros(5, dtype=torch.long))


def test_registered_as_counterfactual() -> None:
    for name, cls in (("fgsm", FGSM), ("pgd", PGD), ("autoattack", AutoAttack)):
        assert INTERVENTIONS.get(name) is cls and cls.kind == "counterfactual"


def test_pgd_returns_the_last_iterate_by_default_and_the_best_on_request() -> None:
    """The paper's attack returns x_T (three hand-rolled sign steps, clipped to the ε-ball); ``best`` keeps,
    per row, the iterate that reached z' first / had the lowest loss, which differs on some rows."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    X = torch.randn(40, 6)
    z_target = torch.randint(0, 3, (40,))
    kw = dict(eps=0.5, steps=3, step_size=0.4, random_start=False)
    last = PGD.from_module(lin, 3, **kw).transform(X, z_target)
    # hand-rolled: x_{t+1} = clip(x_t − α·sign(∇CE), x ± ε), three times; the last one is returned
    x = X.clone()
    for _ in range(3):
        x.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(lin(x), z_target, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
        x = torch.max(torch.min(x.detach() - 0.4 * g.sign(), X + 0.5), X - 0.5)
    torch.testing.assert_close(last, x)
    best = PGD.from_module(lin, 3, select="best", **kw).transform(X, z_target)
    assert not torch.equal(best, last)  # some rows are better at an earlier iterate
    with pytest.raises(ConfigError, match="select"):
        PGD(0.1, select="first")
