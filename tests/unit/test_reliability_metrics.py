"""Completeness / selectivity / reliability (Canby et al. 2024, eqs. 1-3) against hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.metrics.reliability import (
    counterfactual_completeness,
    nullifying_completeness,
    reliability,
    selectivity,
    tv_distance,
)


def T(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_tv_distance_hand_case() -> None:
    d = tv_distance(T([[0.8, 0.2], [0.5, 0.5]]), T([[0.5, 0.5], [0.5, 0.5]]))
    assert d.tolist() == pytest.approx([0.3, 0.0])
    d3 = tv_distance(T([[0.5, 0.3, 0.2]]), T([[0.0, 1.0, 0.0]]))
    assert d3.item() == pytest.approx(0.7)


def test_counterfactual_completeness_k2() -> None:
    p_hat = T([[0.8, 0.2], [0.8, 0.2], [0.0, 1.0], [1.0, 0.0]])
    c = counterfactual_completeness(p_hat, torch.tensor([0, 1, 1, 0]))
    # 1 - ½(|.8-1| + |.2-0|) = .8; the other target .2; perfect interventions hit 1
    assert c.tolist() == pytest.approx([0.8, 0.2, 1.0, 1.0])


def test_counterfactual_completeness_k3_and_adversarial_zero() -> None:
    p_hat = T([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    c = counterfactual_completeness(p_hat, torch.tensor([1, 2]))
    # ½(.5 + .7 + .2) = .7 -> .3 ; the oracle certain of another value -> 0
    assert c.tolist() == pytest.approx([0.3, 0.0])


def test_nullifying_completeness_k2() -> None:
    c = nullifying_completeness(T([[0.8, 0.2], [0.5, 0.5], [0.0, 1.0]]))
    # δ(.8/.2, U) = .3 -> 1 - 2·.3 = .4 ; uniform -> 1 ; one-hot -> 0
    assert c.tolist() == pytest.approx([0.4, 1.0, 0.0], abs=1e-6)


def test_nullifying_completeness_k3() -> None:
    c = nullifying_completeness(T([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]]))
    # δ = ½(1/6 + 1/30 + 2/15) = 1/6 -> 1 - 3/2 · 1/6 = .75 ; one-hot: δ = 2/3 -> 0
    assert c.tolist() == pytest.approx([0.75, 1.0, 0.0], abs=1e-6)


def test_selectivity_k2() -> None:
    p = T([[0.7, 0.3], [0.7, 0.3], [0.7, 0.3]])
    p_hat = T([[0.4, 0.6], [0.7, 0.3], [0.0, 1.0]])
    s = selectivity(p_hat, p)
    # δ = .3, m = max(1 - .3, .7) = .7 -> 1 - 3/7 ; unchanged -> 1 ; all mass on argmin -> 0
    assert s.tolist() == pytest.approx([1 - 3 / 7, 1.0, 0.0], abs=1e-6)


def test_selectivity_k3() -> None:
    p = T([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    p_hat = T([[0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    s = selectivity(p_hat, p)
    # δ = .4, m = max(.9, .6) = .9 -> 1 - 4/9 ; the farthest possible P̂ -> 0
    assert s.tolist() == pytest.approx([1 - 4 / 9, 0.0], abs=1e-6)


def test_selectivity_mask_skips_rows() -> None:
    p = T([[0.7, 0.3], [0.7, 0.3]])
    p_hat = T([[0.7, 0.3], [0.0, 1.0]])
    s = selectivity(p_hat, p, mask=torch.tensor([True, False]))
    assert s[0].item() == pytest.approx(1.0)
    assert math.isnan(s[1].item())
    assert torch.nanmean(s).item() == pytest.approx(1.0)


def test_reliability_harmonic_mean() -> None:
    assert reliability(1.0, 1.0) == pytest.approx(1.0)
    assert reliability(0.0, 0.0) == 0.0
    assert reliability(1.0, 0.0) == 0.0
    assert reliability(0.5, 1.0) == pytest.approx(2 / 3)
    # Canby et al. Table 1: AlterRep C=1, S=.7162 -> R=.8346 ; INLP C=.3308, S=.7792 -> .4644
    assert reliability(1.0, 0.7162) == pytest.approx(0.8346, abs=1e-4)
    assert reliability(0.3308, 0.7792) == pytest.approx(0.4644, abs=1e-4)
    r = reliability(torch.tensor([0.0, 0.5]), torch.tensor([0.0, 1.0]))
    assert isinstance(r, torch.Tensor) and r.tolist() == pytest.approx([0.0, 2 / 3])


def test_shape_errors() -> None:
    with pytest.raises(ConfigError, match="same shape"):
        selectivity(T([[0.5, 0.5]]), T([[0.2, 0.3, 0.5]]))
    with pytest.raises(ConfigError, match=r"\(n, k\)"):
        nullifying_completeness(torch.tensor([0.5, 0.5]))
