"""The 1-D DII swaps exactly the component along a unit direction (CausalGym eq. 11)."""

from __future__ import annotations

import torch

from cprobe.models.edits import dii, dii_edit, vanilla, vanilla_edit


def _unit(d: int, seed: int) -> torch.Tensor:
    a = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return a / a.norm()


def test_hand_computed_case() -> None:
    b, s, a = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]), torch.tensor([0.6, 0.8])
    # (s − b)·a = 2·0.6 − 3·0.8 = −1.2, so b + (−1.2)·a = (1 − 0.72, 2 − 0.96)
    torch.testing.assert_close(dii(b, s, a), torch.tensor([[0.28, 1.04]]))


def test_source_equal_to_base_is_identity() -> None:
    h = torch.randn(5, 16)
    torch.testing.assert_close(dii(h, h.clone(), _unit(16, 0)), h)


def test_basis_direction_swaps_exactly_that_coordinate() -> None:
    b, s = torch.randn(6, 8), torch.randn(6, 8)
    out = dii(b, s, torch.eye(8)[3])
    torch.testing.assert_close(out[:, 3], s[:, 3])
    keep = [i for i in range(8) if i != 3]
    torch.testing.assert_close(out[:, keep], b[:, keep])


def test_projection_taken_from_source_rest_from_base() -> None:
    b, s, a = torch.randn(10, 32), torch.randn(10, 32), _unit(32, 1)
    out = dii(b, s, a)
    torch.testing.assert_close(out @ a, s @ a)
    orth = lambda h: h - (h @ a)[:, None] * a  # noqa: E731
    torch.testing.assert_close(orth(out), orth(b), atol=1e-5, rtol=1e-5)


def test_vanilla_returns_source() -> None:
    b, s = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(vanilla(b, s), s)
    torch.testing.assert_close(vanilla_edit(s)(b), s)


def test_gradients_flow_to_direction_and_inputs() -> None:
    b = torch.randn(3, 8, requires_grad=True)
    s = torch.randn(3, 8, requires_grad=True)
    v = torch.randn(8, requires_grad=True)
    dii(b, s, v / v.norm()).pow(2).sum().backward()
    for t in (b, s, v):
        assert t.grad is not None and t.grad.abs().sum() > 0


def test_edit_closure_matches_function_and_keeps_dtype() -> None:
    b, s, a = torch.randn(4, 8), torch.randn(4, 8), _unit(8, 2)
    torch.testing.assert_close(dii_edit(s, a)(b), dii(b, s, a))
    out = dii_edit(s, a)(b.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dii(b.bfloat16().float(), s, a), atol=0.05, rtol=0.02)
