"""Concept-effect explainers (CEBaB): each on a small hand-built case whose answer is known, their mathematical
properties, and a conformance suite over the registry. Models and data are built here, not read from disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cprobe.errors import ConfigError, NotFittedError
from cprobe.explainers import EXPLAINERS, ExplainedModel, Observed, Queries
from cprobe.explainers.causalm import grad_reverse, mutual_information
from cprobe.explainers.conceptshap import shapley_values, shapley_weight
from cprobe.explainers.tcav import directional_derivatives, fit_cav

VALUES = ("Negative", "Positive", "unknown")
CONCEPTS = ("food", "service")


def linear_head(W: np.ndarray, b: np.ndarray | None = None) -> nn.Linear:
    head = nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(W, dtype=torch.float32))
        head.bias.copy_(torch.as_tensor(b if b is not None else np.zeros(W.shape[0]), dtype=torch.float32))
    return head


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def world():
    """φ ∈ R^4: dim 0 = food sentiment (−1 Neg, +1 Pos, 0 unknown), dim 1 = food mentioned (1/0), dim 2 = service
    sentiment, dim 3 = service mentioned, plus small noise. The model's logit for class 1 = 2·food + 1·service."""
    rng = np.random.default_rng(0)
    n = 600
    code = {"Negative": -1.0, "Positive": 1.0, "unknown": 0.0}
    food = rng.choice(VALUES, n)
    service = rng.choice(VALUES, n)
    X = np.stack([[code[f], float(f != "unknown"), code[s], float(s != "unknown")] for f, s in zip(food, service)])
    X = X + 0.05 * rng.standard_normal(X.shape)
    W = np.array([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 1.0, 0.0]])
    head = linear_head(W)
    probs = softmax(X @ W.T)
    concepts = [{"food": f, "service": s} for f, s in zip(food, service)]
    labels = probs.argmax(1)
    reps = torch.tensor(X, dtype=torch.float32)
    onehot = {"food": (np.array(food)[:, None] == np.array(VALUES)).astype(float),
              "service": (np.array(service)[:, None] == np.array(VALUES)).astype(float)}
    train = Observed(texts=[f"t{i}" for i in range(n)], probs=probs, concepts=concepts,
                     reps=reps, predicted=concepts, labels=labels,
                     groups=[f"g{i // 3}" for i in range(n)], embeddings={"st": reps, "pt": reps, "ft": reps},
                     concept_probs=onehot)
    model = ExplainedModel(head, 2, CONCEPTS, VALUES)
    return model, train, X, W


def queries_for(train: Observed, rows, aspect, c, c2) -> Queries:
    rows = list(rows)
    base = Observed(texts=[train.texts[i] for i in rows], probs=train.probs[rows],
                    reps=train.reps[torch.tensor(rows)],
                    predicted=None if train.predicted is None else [train.predicted[i] for i in rows],
                    groups=None if train.groups is None else [train.groups[i] for i in rows],
                    embeddings=None if train.embeddings is None else {k: v[torch.tensor(rows)] for k, v in
                                                                      train.embeddings.items()},
                    concept_probs=None if train.concept_probs is None else {k: v[rows] for k, v in
                                                                            train.concept_probs.items()})
    return Queries(base, [aspect] * len(rows), [c] * len(rows), [c2] * len(rows))


# ------------------------------------------------------------------------------------------- conformance
# Every registered explainer's contract (not fitted, fit returns self, (n, K) finite estimates, seeded, save/load):
# tests/unit/test_conformance.py, the checks `cprobe check` runs on outside explainers too.


def test_estimates_are_differences_of_distributions(world):
    """Every explainer but TCAV (directional derivatives) estimates a difference of two class distributions."""
    model, train, _, _ = world
    q = queries_for(train, range(10), "food", "Negative", "Positive")
    for name in ("approx", "conexp", "s_learner", "leace", "via_mean_diff", "st_match", "convecs"):
        out = EXPLAINERS.build({"name": name}, seed=0).fit(model, train).explain(q)
        np.testing.assert_allclose(out.sum(1), 0.0, atol=1e-6, err_msg=name)


def test_unknown_explainer_is_a_one_line_error():
    with pytest.raises(ConfigError, match="unknown explainer 'shap'; choose from"):
        EXPLAINERS.build({"name": "shap"})


def test_capabilities_are_declared():
    needs = {n: (c.needs_representation, c.needs_predicted_concepts, c.removal_only)
             for n, c in ((n, EXPLAINERS.get(n)) for n in EXPLAINERS.names())}
    assert needs["approx"] == (False, True, False) and needs["s_learner"] == (False, True, False)
    assert needs["tcav"][0] and needs["conceptshap"][0] and needs["inlp"] == (True, False, True)
    assert EXPLAINERS.get("causalm").needs_training and EXPLAINERS.get("leace").removal_only


def test_missing_capability_input_is_an_error(world):
    model, train, _, _ = world
    bare = Observed(texts=train.texts, probs=train.probs, concepts=train.concepts)
    with pytest.raises(ConfigError, match="needs the representation"):
        EXPLAINERS.build({"name": "tcav"}).fit(model, bare)
    with pytest.raises(ConfigError, match="needs predicted concept labels"):
        EXPLAINERS.build({"name": "approx"}).fit(model, bare)


# ------------------------------------------------------------------------------------------- hand-computed
def test_random_is_a_difference_of_two_l1_normalised_uniform_vectors():
    from cprobe.metrics.icace import cosine

    ex = EXPLAINERS.build({"name": "random"}, seed=3)
    obs = Observed(texts=["a"] * 4000, probs=np.full((4000, 3), 1 / 3))
    ex.fit(ExplainedModel(nn.Linear(2, 3), 3, ("food",), VALUES), obs)
    out = ex.explain(Queries(obs, ["food"] * 4000, ["Negative"] * 4000, ["Positive"] * 4000))
    rng = np.random.default_rng(3)
    a, b = rng.uniform(size=(4000, 3)), rng.uniform(size=(4000, 3))
    np.testing.assert_allclose(out, b / b.sum(1, keepdims=True) - a / a.sum(1, keepdims=True))
    # against any fixed effect the expected cosine error is 1 (the paper's Random ≈ 1.00)
    assert abs(cosine(out, np.tile([0.5, -0.2, -0.3], (4000, 1))).mean() - 1.0) < 0.03


def test_conexp_is_a_difference_of_group_means():
    probs = np.array([[0.2, 0.8], [0.4, 0.6], [0.9, 0.1], [0.5, 0.5]])
    concepts = [{"food": "Positive"}, {"food": "Positive"}, {"food": "Negative"}, {"food": "unknown"}]
    obs = Observed(texts=list("abcd"), probs=probs, concepts=concepts)
    ex = EXPLAINERS.build({"name": "conexp"}).fit(ExplainedModel(nn.Linear(1, 2), 2, ("food",), VALUES), obs)
    base = Observed(texts=["x", "y"], probs=np.array([[0.5, 0.5], [0.1, 0.9]]))
    out = ex.explain(Queries(base, ["food", "food"], ["Negative", "Positive"], ["Positive", "unknown"]))
    np.testing.assert_allclose(out, [[0.3 - 0.9, 0.7 - 0.1], [0.5 - 0.3, 0.5 - 0.7]])  # same for every text


def test_approx_uses_another_units_text_with_the_counterfactual_labels():
    probs = np.array([[0.1, 0.9], [0.3, 0.7], [0.6, 0.4], [0.8, 0.2]])
    predicted = [{"food": "Positive", "service": "Positive"},  # the match, but from the base's own unit
                 {"food": "Positive", "service": "Positive"},  # the match from another unit
                 {"food": "Positive", "service": "Negative"},
                 {"food": "Negative", "service": "Positive"}]
    train = Observed(texts=list("abcd"), probs=probs, predicted=predicted, groups=["u0", "u1", "u2", "u3"])
    ex = EXPLAINERS.build({"name": "approx"}).fit(ExplainedModel(nn.Linear(1, 2), 2, CONCEPTS, VALUES), train)
    base = Observed(texts=["q"], probs=np.array([[0.75, 0.25]]), predicted=[{"food": "Negative", "service": "Positive"}],
                    groups=["u0"])
    out = ex.explain(Queries(base, ["food"], ["Negative"], ["Positive"]))
    np.testing.assert_allclose(out, [[0.3 - 0.75, 0.7 - 0.25]])
    assert ex.fallbacks_ == {"nearest": 0, "none": 0}
    for seed in range(10):  # never the base's own unit, whatever the draw
        other = EXPLAINERS.build({"name": "approx"}, seed=seed).fit(ExplainedModel(nn.Linear(1, 2), 2, CONCEPTS,
                                                                                  VALUES), train)
        np.testing.assert_allclose(other.explain(Queries(base, ["food"], ["Negative"], ["Positive"])), out)
    # no exact match for (food Negative, service Negative): the nearest text with food = Negative stands in
    base2 = Observed(texts=["r"], probs=np.array([[0.5, 0.5]]), predicted=[{"food": "Positive", "service": "Negative"}],
                     groups=["u9"])
    out2 = ex.explain(Queries(base2, ["food"], ["Positive"], ["Negative"]))
    np.testing.assert_allclose(out2, [[0.8 - 0.5, 0.2 - 0.5]])
    assert ex.fallbacks_["nearest"] == 1
    # the nearest fallback keeps C = c′ and never the base's own unit: a closer text with the wrong food label, or
    # of the base's own unit, is never used
    near = Observed(texts=list("xyz"), probs=np.array([[0.2, 0.8], [0.6, 0.4], [0.9, 0.1]]),
                    predicted=[{"food": "Positive", "service": "Positive"},  # C wrong, other labels match
                               {"food": "Negative", "service": "Negative"},  # own unit
                               {"food": "Negative", "service": "Negative"}], groups=["v0", "u9", "v2"])
    ex_near = EXPLAINERS.build({"name": "approx"}).fit(ExplainedModel(nn.Linear(1, 2), 2, CONCEPTS, VALUES), near)
    for seed in range(5):
        ex_near.seed = seed
        np.testing.assert_allclose(ex_near.explain(Queries(base2, ["food"], ["Positive"], ["Negative"])),
                                   [[0.9 - 0.5, 0.1 - 0.5]])
    # LIBERTy's rule: one mismatch allowed (here one), none at max_mismatches 0
    one = EXPLAINERS.build({"name": "approx", "max_mismatches": 1}).fit(ExplainedModel(nn.Linear(1, 2), 2, CONCEPTS,
                                                                                       VALUES), train)
    np.testing.assert_allclose(one.explain(Queries(base2, ["food"], ["Positive"], ["Negative"])), out2)
    zero = EXPLAINERS.build({"name": "approx", "max_mismatches": 0}).fit(ExplainedModel(nn.Linear(1, 2), 2, CONCEPTS,
                                                                                        VALUES), train)
    np.testing.assert_allclose(zero.explain(Queries(base2, ["food"], ["Positive"], ["Negative"])), [[0.0, 0.0]])
    assert zero.fallbacks_ == {"nearest": 0, "none": 1}


def test_s_learner_is_lr_on_one_hot_concepts_evaluated_at_the_counterfactual(world):
    from sklearn.linear_model import LogisticRegression

    model, train, _, _ = world
    noisy = Observed(texts=train.texts, probs=train.probs, concepts=train.concepts, reps=train.reps,
                     predicted=[{"food": "unknown", "service": "unknown"}] * len(train), labels=train.labels)
    ex = EXPLAINERS.build({"name": "s_learner"}).fit(model, noisy)  # fit on gold labels, not predicted ones
    q = queries_for(train, range(30), "food", "Negative", "Positive")
    out = ex.explain(q)

    def onehot(labels):
        return np.array([[float(l[c] == v) for c in CONCEPTS for v in VALUES] for l in labels])

    lr = LogisticRegression(max_iter=1000).fit(onehot(train.concepts), train.probs.argmax(1))
    fact = [dict(p) for p in q.base.predicted]
    cf = [dict(p, food="Positive") for p in fact]
    np.testing.assert_allclose(out, lr.predict_proba(onehot(cf)) - lr.predict_proba(onehot(fact)), atol=1e-8)
    # the model reads food: making it Positive raises class 1 unless it already was Positive
    already = np.array([p["food"] == "Positive" for p in fact])
    assert (out[~already, 1] > 0.05).all() and np.allclose(out[already], 0.0)


def test_tcav_cav_points_to_mention_and_estimate_is_tanh_of_directional_derivative(world):
    model, train, _, W = world
    v = fit_cav(train.reps, train.concepts, "food", VALUES, "unknown")
    assert v[1] < -0.9  # along the food-mentioned dimension, towards "not mentioned" (the public code's −coef)
    W2 = np.array([[0.0, 1.5, 0.0, 0.0], [0.5, -2.0, 0.0, 0.0]])  # logits move along the mention direction
    ex = EXPLAINERS.build({"name": "tcav"}).fit(ExplainedModel(linear_head(W2), 2, CONCEPTS, VALUES), train)
    q = queries_for(train, range(5), "food", "Negative", "unknown")
    expected = np.tanh(W2 @ ex.cavs_["food"].numpy())  # a linear head: ∇ logit_k = W_k everywhere
    assert np.abs(expected).max() > 0.8  # tanh is far from the identity here
    np.testing.assert_allclose(ex.explain(q), np.tile(expected, (5, 1)), atol=1e-6)


def test_directional_derivative_of_a_nonlinear_head_matches_finite_differences():
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    v = torch.tensor([0.6, 0.0, 0.8], dtype=torch.float64)
    eps = 1e-6
    fd = ((head(x + eps * v) - head(x - eps * v)) / (2 * eps)).detach().numpy()
    np.testing.assert_allclose(directional_derivatives(head, x, v), fd, atol=1e-6)


def test_shapley_values_hand_computed_and_efficient():
    eta = {frozenset(): np.array([[0.0]]), frozenset({0}): np.array([[1.0]]), frozenset({1}): np.array([[2.0]]),
           frozenset({0, 1}): np.array([[4.0]])}
    phi = shapley_values(eta, 2)
    np.testing.assert_allclose(phi[:, 0, 0], [0.5 * 1 + 0.5 * 2, 0.5 * 2 + 0.5 * 3])  # 1.5, 2.5
    assert shapley_weight(0, 4) == pytest.approx(6 / 24) and shapley_weight(2, 4) == pytest.approx(2 / 24)
    assert sum(shapley_weight(s, 4) * {0: 1, 1: 3, 2: 3, 3: 1}[s] for s in range(4)) == pytest.approx(1.0)


def test_conceptshap_estimates_are_efficient_over_concepts(world):
    model, train, _, _ = world
    ex = EXPLAINERS.build({"name": "conceptshap", "epochs": 3, "hidden": 32}).fit(model, train)
    rows = list(range(8))
    total = sum(ex.explain(queries_for(train, rows, c, "Negative", "Positive")) for c in CONCEPTS)
    eta = ex.eta(train.reps[torch.tensor(rows)])
    np.testing.assert_allclose(total, eta[frozenset({0, 1})] - eta[frozenset()], atol=1e-9)
    # mention CAVs carry no polarity, and this model decides on polarity: the concepts are not complete
    assert ex.completeness_ < 0.3


def test_conceptshap_completeness_when_the_model_decides_on_a_concept_direction(world):
    _, train, X, _ = world
    head = linear_head(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 0.0, 0.0]]), np.array([0.0, -2.0]))
    probs = softmax(X @ head.weight.detach().numpy().T + head.bias.detach().numpy())
    obs = Observed(texts=train.texts, probs=probs, concepts=train.concepts, reps=train.reps, labels=probs.argmax(1))
    ex = EXPLAINERS.build({"name": "conceptshap", "epochs": 5, "hidden": 32}).fit(
        ExplainedModel(head, 2, CONCEPTS, VALUES), obs)
    assert ex.completeness_ > 0.9  # class 1 iff food is mentioned: the food CAV score alone suffices
    q = queries_for(obs, range(20), "food", "Negative", "unknown")
    food = ex.explain(q)
    service = ex.explain(Queries(q.base, ["service"] * 20, ["Negative"] * 20, ["unknown"] * 20))
    assert np.abs(food).mean() > 5 * np.abs(service).mean()  # the deciding concept gets the credit


def test_inlp_removes_the_concept_and_ignores_c_prime(world):
    from sklearn.linear_model import LogisticRegression

    model, train, X, _ = world
    ex = EXPLAINERS.build({"name": "inlp", "iterations": 2, "head_epochs": 0}).fit(model, train)
    P = ex.P_["food"].numpy()
    z = np.array([VALUES.index(c["food"]) for c in train.concepts])
    acc = LogisticRegression(max_iter=2000).fit(X @ P, z).score(X @ P, z)
    majority = np.bincount(z).max() / len(z)
    assert acc < majority + 0.05  # an independent adversary cannot read food after the projection
    # the explainer's diagnostic uses a stronger adversary (standardised features): INLP removes only what its own
    # classifier finds, so some of food stays readable — less than before
    before, after, majority_rate = ex.leftover_["food"]
    assert before > 0.95 and after < before - 0.15 and after > majority_rate - 0.1
    q1 = queries_for(train, range(6), "food", "Negative", "Positive")
    q2 = queries_for(train, range(6), "food", "Negative", "unknown")
    np.testing.assert_allclose(ex.explain(q1), ex.explain(q2))
    # with the head unchanged (0 epochs): softmax(W P φ) − softmax(W φ) by hand
    W = model.head.weight.detach().numpy()
    expected = softmax(X[:6] @ P @ W.T) - train.probs[:6]
    np.testing.assert_allclose(ex.explain(q1), expected, atol=1e-5)


def test_inlp_retrains_the_head_on_the_projected_representation(world):
    from cprobe.explainers.inlp import retrain_head

    model, train, X, _ = world
    ex = EXPLAINERS.build({"name": "inlp", "iterations": 2, "head_epochs": 30, "head_lr": 0.05}).fit(model, train)
    P = ex.P_["food"]
    ref = retrain_head(model.head, train.reps.float() @ P, torch.as_tensor(train.labels), 30, 0.05)
    for p, q in zip(ex.heads_["food"].parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    q = queries_for(train, range(6), "food", "Negative", "Positive")
    with torch.no_grad():
        expected = ref(torch.tensor(X[:6], dtype=torch.float32) @ P).softmax(-1).double().numpy() - train.probs[:6]
    np.testing.assert_allclose(ex.explain(q), expected, atol=1e-5)


def test_inlp_head_retraining_moves_the_head():
    from cprobe.explainers.inlp import retrain_head

    head = linear_head(np.zeros((2, 2)))
    X = torch.tensor([[1.0, 0.0], [-1.0, 0.0]] * 10)
    y = torch.tensor([1, 0] * 10)
    new = retrain_head(head, X, y, epochs=50, lr=0.1)
    assert (new(X).argmax(1) == y).all().item() and float(head.weight.detach().abs().sum()) == 0.0  # a copy is trained


def test_leace_erases_linearly_and_keeps_the_head(world):
    from sklearn.linear_model import LogisticRegression

    model, train, X, W = world
    ex = EXPLAINERS.build({"name": "leace"}).fit(model, train)
    z = np.array([VALUES.index(c["food"]) for c in train.concepts])
    Xe = ex.interventions_["food"].transform(train.reps).numpy()
    acc = LogisticRegression(max_iter=2000).fit(Xe, z).score(Xe, z)
    assert acc < np.bincount(z).max() / len(z) + 0.05
    assert ex.leftover_["food"][0] > 0.95 and ex.leftover_["food"][1] < np.bincount(z).max() / len(z) + 0.05
    q = queries_for(train, range(5), "food", "Positive", "unknown")
    np.testing.assert_allclose(ex.explain(q), softmax(Xe[:5] @ W.T) - train.probs[:5], atol=1e-5)
    # the model reads food (weight 2): erasing it must change the prediction where food was mentioned
    assert np.abs(ex.explain(q)).max() > 0.1


def test_gradient_reversal_and_mutual_information():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (grad_reverse(x, 0.1) * torch.tensor([3.0, 4.0])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-0.3, -0.4])
    a = np.array([0, 1] * 50)
    assert mutual_information(a, a) == pytest.approx(np.log(2))
    assert mutual_information(a, np.array([0, 0, 1, 1] * 25)) == pytest.approx(0.0, abs=1e-12)
    assert mutual_information(a, np.full(100, -1)) == 0.0  # nothing labelled on one side


def test_causalm_objective_reverses_only_the_adversarys_gradient_into_phi():
    from cprobe.explainers.causalm import causalm_loss

    torch.manual_seed(0)
    phi = torch.randn(6, 4, requires_grad=True)
    target = torch.randn(6, 4)
    adv, ctl = nn.Linear(4, 3), nn.Linear(4, 3)
    zt, zc = torch.tensor([0, 1, 2, -1, 0, 1]), torch.tensor([2, 2, 1, 0, -1, 0])
    loss = causalm_loss(phi, target, adv, ctl, zt, zc, adversarial_weight=0.1, preserve_weight=1.0)
    loss.backward()
    # by hand: each term's gradient into φ, the adversary's scaled by −λ; its own weights get the plain gradient
    p2 = phi.detach().clone().requires_grad_(True)
    keep = nn.functional.mse_loss(p2, target) + nn.functional.cross_entropy(ctl(p2), zc, ignore_index=-1)
    g_keep, = torch.autograd.grad(keep, p2)
    p3 = phi.detach().clone().requires_grad_(True)
    adv_loss = nn.functional.cross_entropy(adv(p3), zt, ignore_index=-1)
    g_adv, = torch.autograd.grad(adv_loss, p3)
    torch.testing.assert_close(phi.grad, g_keep - 0.1 * g_adv)
    w_grad, = torch.autograd.grad(nn.functional.cross_entropy(adv(phi.detach()), zt, ignore_index=-1), adv.weight)
    torch.testing.assert_close(adv.weight.grad, w_grad)
    assert float(loss.detach()) == pytest.approx(float((keep + adv_loss).detach()), rel=1e-6)


def test_probe_accuracy_by_hand():
    from cprobe.explainers.base import leftover_split, probe_accuracy

    X = np.array([[0.0], [0.1], [0.2], [1.0], [1.1], [1.2]] * 3)
    z = np.array([0, 0, 0, 1, 1, 1] * 3)
    assert probe_accuracy(X[:9], z[:9], X[9:], z[9:]) == 1.0
    assert probe_accuracy(np.zeros((9, 1)), z[:9], np.zeros((9, 1)), z[9:]) == pytest.approx(0.5, abs=0.2)
    assert np.isnan(probe_accuracy(X, np.zeros(18, dtype=int), X, z))  # one class to learn from: undefined
    z2 = z.copy()
    z2[:6] = -1  # unlabelled rows belong to no part
    fit, train, test = leftover_split(z2, seed=0)
    parts = np.concatenate([fit, train, test])
    assert len(parts) == len(set(parts)) == 12 and not set(parts) & set(range(6))
    assert len(fit) == 6 and len(train) == 2 and len(test) == 4  # per class: half, a quarter, the rest
    assert sorted(np.bincount(z2[fit])) == [3, 3]


def test_leftover_is_scored_on_rows_the_eraser_never_saw():
    """Erasing the rows a probe is scored on removes their own class means, and the held-out accuracy falls below
    chance (the artefact CEBaB's removal diagnostics showed: 0.07-0.17 on a 3-class label, majority ~0.4). Fit on
    one part and scored on another, nothing left to read reads as chance, not below it."""
    from cprobe.explainers.base import leftover
    from cprobe.interventions.leace import LEACE

    rng = np.random.default_rng(0)
    z = rng.integers(0, 3, 900)
    X = torch.tensor(rng.standard_normal((900, 8)) + np.eye(8)[z] * 3, dtype=torch.float32)
    before, after, majority = leftover(X, z, lambda A, y: LEACE().fit(A, y).transform, seed=0)
    assert before > 0.9 and majority == pytest.approx(np.bincount(z).max() / 900, abs=0.05)
    assert majority - 0.08 < after < majority + 0.08
    # the in-sample artefact, for contrast: the eraser fit on every row, the probe cross-validated on them
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    erased = LEACE().fit(X, torch.from_numpy(z)).transform(X).numpy()
    assert cross_val_score(LogisticRegression(), erased, z, cv=3).mean() < majority - 0.03


def test_erasers_of_one_concept_share_the_probe_of_the_original_states(monkeypatch):
    """Two erasers of one concept on the same states (INLP and LEACE in one CEBaB job): the fresh probe of the original
    states is fitted once, and both report its accuracy; other states or labels are another probe."""
    from cprobe.explainers import base
    from cprobe.interventions.leace import LEACE

    rng = np.random.default_rng(1)
    z = rng.integers(0, 2, 400)
    X = torch.tensor(rng.standard_normal((400, 6)) + np.eye(6)[z] * 2, dtype=torch.float32)
    fits = []
    monkeypatch.setattr(base, "probe_accuracy", lambda *a, **k: fits.append(k.get("scale_from")) or len(fits) / 10)
    monkeypatch.setattr(base, "_READ_BEFORE", {})
    first = base.leftover(X, z, lambda A, y: LEACE().fit(A, y).transform)
    second = base.leftover(X, z, lambda A, y: (lambda B: B * 0))
    assert first[0] == second[0] == 0.1 and len(fits) == 3  # before once, after twice
    assert fits[0] is None and all(f is not None for f in fits[1:])  # before on its own scale, after on the raw one
    base.leftover(X + 1, z, lambda A, y: (lambda B: B * 0))
    base.leftover(X, 1 - z, lambda A, y: (lambda B: B * 0))
    assert len(fits) == 7


def test_s_learner_of_a_model_that_predicts_one_class_sees_no_effect(world):
    model, train, _, _ = world
    flat = Observed(texts=train.texts, probs=np.tile([0.3, 0.7], (len(train), 1)), concepts=train.concepts,
                    predicted=train.predicted)
    ex = EXPLAINERS.build({"name": "s_learner"}).fit(model, flat)
    np.testing.assert_allclose(ex.explain(queries_for(train, range(4), "food", "Negative", "Positive")), 0.0)


# ------------------------------------------------------------------------------------------- matching (LIBERTy)
def _matching_world():
    """Pool of 6 texts on a circle at different norms (cosine, not dot products, must rank them); concept "c" ∈
    {"0", "1"} (gold = predicted), concept "d" carries the concept-classifier vectors ConVecs ranks by; the query
    sits at angle 0 and belongs to unit "me", as does the pool's last text."""
    ang = np.array([0.1, 0.2, 0.3, 1.0, 2.0, 0.15])
    norms = np.array([5.0, 0.2, 1.0, 9.0, 30.0, 1.0])
    E = torch.tensor(np.stack([np.cos(ang), np.sin(ang)], 1) * norms[:, None], dtype=torch.float32)
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.1, 0.9]])
    concepts = [{"c": v, "d": "0"} for v in ("1", "1", "0", "1", "1", "1")]
    groups = ["u0", "u1", "u2", "u3", "u4", "me"]
    vec = {"c": np.tile([0.5, 0.5], (6, 1)), "d": E.double().numpy()}  # ConVecs ignores the changed concept's block
    pool = Observed(texts=list("abcdef"), probs=probs, concepts=concepts, predicted=concepts, groups=groups,
                    embeddings={"ft": E, "st": E, "pt": E}, concept_probs=vec)
    model = ExplainedModel(nn.Linear(2, 2), 2, ("c", "d"), ("0", "1"))
    q1 = torch.tensor([[3.0, 0.0]])
    q = Observed(texts=["q"], probs=np.array([[0.4, 0.6]]), groups=["me"], predicted=[{"c": "0", "d": "0"}],
                 embeddings={"ft": q1, "st": q1, "pt": q1},
                 concept_probs={"c": np.array([[1.0, 0.0]]), "d": np.array([[3.0, 0.0]])})
    return model, pool, q


@pytest.mark.parametrize("name", ["ft_match", "st_match", "pt_match", "convecs"])
def test_matching_averages_the_k_most_similar_texts_with_the_target_value(name):
    model, pool, q = _matching_world()
    est = EXPLAINERS.build({"name": name, "k": 2}).fit(model, pool).explain(Queries(q, ["c"], ["0"], ["1"]))
    # candidates with c = "1": angles .1, .2, 1.0, 2.0 and .15 (the query's own unit "me": excluded) → top-2 by
    # cosine .1, .2 (by dot product, the far-out 1.0 and 2.0 would win)
    np.testing.assert_allclose(est, [[(0.9 + 0.8) / 2 - 0.4, (0.1 + 0.2) / 2 - 0.6]])
    est0 = EXPLAINERS.build({"name": name, "k": 3}).fit(model, pool).explain(Queries(q, ["c"], ["1"], ["0"]))
    np.testing.assert_allclose(est0, [[0.7 - 0.4, 0.3 - 0.6]])  # only one text has c = "0": k shrinks to 1
    # k larger than the candidates left once the own unit is excluded: the 5 others, never the own unit's text
    est5 = EXPLAINERS.build({"name": name, "k": 6}).fit(model, pool).explain(Queries(q, ["c"], ["0"], ["1"]))
    np.testing.assert_allclose(est5, [[np.mean([0.9, 0.8, 0.6, 0.5]) - 0.4, np.mean([0.1, 0.2, 0.4, 0.5]) - 0.6]])


def test_matching_with_no_candidate_is_zero_and_counted():
    model, pool, q = _matching_world()
    ex = EXPLAINERS.build({"name": "ft_match"}).fit(model, pool)
    two = q.take([0, 0])
    np.testing.assert_allclose(ex.explain(Queries(two, ["c", "c"], ["1", "1"], ["2", "2"])), np.zeros((2, 2)))
    assert ex.fallbacks_ == {"none": 2}


def test_convecs_selects_by_predicted_labels_and_ranks_by_the_other_concepts():
    model, pool, q = _matching_world()
    pool.predicted = [{"c": v, "d": "0"} for v in ("1", "0", "0", "1", "1", "1")]  # text b is *predicted* c = "0"
    ex = EXPLAINERS.build({"name": "convecs", "k": 1}).fit(model, pool)
    np.testing.assert_allclose(ex.explain(Queries(q, ["c"], ["1"], ["0"])), [[0.8 - 0.4, 0.2 - 0.6]])  # b (.2) < c (.3)
    gold = EXPLAINERS.build({"name": "ft_match", "k": 1}).fit(model, pool)  # semantic matching: gold labels
    np.testing.assert_allclose(gold.explain(Queries(q, ["c"], ["1"], ["0"])), [[0.7 - 0.4, 0.3 - 0.6]])


def test_matching_spaces_are_declared_capabilities():
    assert {n: EXPLAINERS.get(n).embedding_space for n in ("st_match", "pt_match", "ft_match", "convecs")} == {
        "st_match": "st", "pt_match": "pt", "ft_match": "ft", "convecs": None}
    assert EXPLAINERS.get("convecs").needs_concept_probs and EXPLAINERS.get("convecs").needs_predicted_concepts
    model, pool, _ = _matching_world()
    with pytest.raises(ConfigError, match="needs the 'st' embeddings"):
        EXPLAINERS.build({"name": "st_match"}).fit(model, Observed(texts=pool.texts, probs=pool.probs,
                                                                   concepts=pool.concepts))
    with pytest.raises(ConfigError, match="needs the concept classifier's distributions"):
        EXPLAINERS.build({"name": "convecs"}).fit(model, Observed(texts=pool.texts, probs=pool.probs,
                                                                  concepts=pool.concepts, predicted=pool.concepts))


# ------------------------------------------------------------------------------------------- missing labels, k > 2
@pytest.fixture(scope="module")
def gappy():
    """A world with missing labels and 3-valued concepts: φ ∈ R^12, food's three values planted along three
    directions, 30 % of the food labels missing ("" or "no majority", as in CEBaB), service always labelled."""
    rng = np.random.default_rng(1)
    n, d = 900, 12
    food = rng.choice(VALUES, n)
    service = rng.choice(VALUES, n)
    X = rng.standard_normal((n, d))
    X[:, :3] += 3.0 * (food[:, None] == np.array(VALUES))
    X[:, 3:6] += 2.0 * (service[:, None] == np.array(VALUES))
    gold = [{"food": f, "service": s} for f, s in zip(food, service)]
    concepts = [{"food": ("" if i % 2 else "no majority") if i % 10 < 3 else g["food"], "service": g["service"]}
                for i, g in enumerate(gold)]
    W = rng.standard_normal((3, d))
    head = linear_head(W)
    probs = softmax(X @ W.T)
    train = Observed(texts=[f"t{i}" for i in range(n)], probs=probs, concepts=concepts,
                     reps=torch.tensor(X, dtype=torch.float32), predicted=gold, labels=probs.argmax(1),
                     groups=[f"g{i}" for i in range(n)])
    return ExplainedModel(head, 3, CONCEPTS, VALUES), train, X, gold


def test_s_learner_codes_a_missing_training_label_as_an_all_zero_block(gappy):
    """The reference (CEBaB's dataset_aspects_to_onehot): '' and 'no majority' give a zero block, not 'unknown'."""
    from sklearn.linear_model import LogisticRegression

    model, train, _, _ = gappy
    ex = EXPLAINERS.build({"name": "s_learner"}).fit(model, train)
    assert ex.missing == "zero"
    row = ex._features([{"food": "", "service": "Positive"}, {"food": "no majority", "service": "unknown"}])
    np.testing.assert_array_equal(row, [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]])

    def reference(labels):  # one-hot per concept, zeros where the label is missing
        return np.array([[float(l[c] == v) for c in CONCEPTS for v in VALUES] for l in labels])

    lr = LogisticRegression(max_iter=1000).fit(reference(train.concepts), train.probs.argmax(1))
    q = queries_for(train, range(40), "food", "Negative", "Positive")
    cf = [dict(p, food="Positive") for p in q.base.predicted]
    np.testing.assert_allclose(ex.explain(q), lr.predict_proba(reference(cf)) - lr.predict_proba(
        reference(q.base.predicted)), atol=1e-6)
    # the option: the null value instead (what cprobe did before; documented, not the default)
    null = EXPLAINERS.build({"name": "s_learner", "missing": "null"}).fit(model, train)
    np.testing.assert_array_equal(null._features([{"food": "", "service": "Positive"}]), [[0, 0, 1, 0, 1, 0]])
    assert np.abs(null.explain(q) - ex.explain(q)).max() > 1e-3
    with pytest.raises(ConfigError, match="missing must be 'zero'"):
        EXPLAINERS.build({"name": "s_learner", "missing": "negative"})


def test_inlp_removes_one_direction_per_class_per_round_for_k_above_2(gappy):
    """The reference's INLP classifier is one-vs-rest: a 3-way concept loses 3 directions per round (30 in the
    paper's 10 rounds), a binary one 1."""
    model, train, _, _ = gappy
    ex = EXPLAINERS.build({"name": "inlp", "iterations": 2, "head_epochs": 0, "diagnose": False}).fit(model, train)
    for concept in CONCEPTS:
        P = ex.P_[concept].numpy()
        assert np.linalg.matrix_rank(P, tol=1e-4) == 12 - 2 * 3, concept
    default = EXPLAINERS.build({"name": "inlp"})
    assert default.directions(3, 768) == 30 and default.directions(2, 768) == 10 and default.directions(5, 20) == 20


def test_tcav_drops_texts_whose_label_is_missing(gappy):
    """TCAV separates texts that mention C from texts that do not (unknown); a missing label is neither, and
    dropping those rows gives exactly the CAV of the labelled rows alone (the paper, App. G.2)."""
    _, train, _, _ = gappy
    reps, concepts = train.reps, list(train.concepts)
    labelled = [i for i, c in enumerate(concepts) if c["food"] in VALUES]
    cav = fit_cav(reps, concepts, "food", VALUES, "unknown", seed=0)
    alone = fit_cav(reps[torch.tensor(labelled)], [concepts[i] for i in labelled], "food", VALUES, "unknown", seed=0)
    np.testing.assert_allclose(cav, alone)
    as_unknown = [{**c, "food": c["food"] if c["food"] in VALUES else "unknown"} for c in concepts]
    assert np.abs(fit_cav(reps, as_unknown, "food", VALUES, "unknown", seed=0) - cav).max() > 1e-3


def test_removal_diagnostics_are_near_chance_not_below_it(gappy):
    model, train, _, _ = gappy
    for name in ("leace", "inlp"):
        ex = EXPLAINERS.build({"name": name, "head_epochs": 0} if name == "inlp" else {"name": name}).fit(model, train)
        before, after, majority = ex.leftover_["food"]
        assert before > 0.9 and after > majority - 0.1, (name, before, after, majority)
    quiet = EXPLAINERS.build({"name": "leace", "diagnose": False}).fit(model, train)
    assert quiet.leftover_ == {}


def test_causalm_control_concepts_follow_the_reference_by_default():
    """The reference's released models pair food→service, service→food, ambiance→food, noise→food; ``mi`` picks
    the other concept with the highest mutual information of the training labels."""
    from cprobe.explainers.causalm import REFERENCE_CONTROL, control_concepts

    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, 500)
    labels = {"food": a, "service": rng.integers(0, 3, 500), "ambiance": (a + (rng.random(500) < 0.1)) % 3,
              "noise": rng.integers(0, 3, 500)}
    aspects = ["food", "service", "ambiance", "noise"]
    assert EXPLAINERS.build({"name": "causalm"}).control == "reference"
    assert control_concepts(aspects, labels) == REFERENCE_CONTROL == {
        "food": "service", "service": "food", "ambiance": "food", "noise": "food"}
    mi = control_concepts(aspects, labels, "mi")
    assert mi["food"] == "ambiance" and mi["ambiance"] == "food"
    # concepts the reference's table does not name (LIBERTy's) fall back to mutual information
    assert control_concepts(["food", "x"], {"food": a, "x": a}) == {"food": "x", "x": "food"}
    with pytest.raises(ConfigError, match="control must be 'reference'"):
        EXPLAINERS.build({"name": "causalm", "control": "pmi"})


def test_explainer_settings_must_be_finite():
    from cprobe.explainers.base import check_explainers

    with pytest.raises(ConfigError, match=r"cebab.explainer.causalm.lr must be a finite number, got nan"):
        check_explainers(["random"], {"causalm": {"lr": float("nan")}}, "cebab")
