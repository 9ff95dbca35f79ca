"""Featurizers and the feature interchange (``cprobe.models.featurizers``): hand-computed cases and properties."""

from __future__ import annotations

import torch

from cprobe.models.edits import dii
from cprobe.models.featurizers import (FeatureInterchange, Featurizer, Identity, Subspace, interchange,
                                       rowwise_interchange)


def test_hand_computed_interchanges_in_two_dimensions():
    base, source = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])
    x = Subspace(torch.tensor([1.0, 0.0]))  # the first axis
    assert torch.equal(interchange(base, source, x), torch.tensor([[3.0, 2.0]]))
    diag = Subspace(torch.tensor([1.0, 1.0]) / 2 ** 0.5)  # (s − b)·a = 2·√2 along a: + (2, 2)
    assert torch.allclose(interchange(base, source, diag), torch.tensor([[3.0, 4.0]]))
    anti = Subspace(torch.tensor([1.0, -1.0]) / 2 ** 0.5)  # (s − b)·a = 0: nothing moves
    assert torch.allclose(interchange(base, source, anti), base)
    ident = Identity(2)
    assert torch.equal(interchange(base, source, ident, torch.tensor([False, True])), torch.tensor([[1.0, 4.0]]))
    assert torch.equal(interchange(base, source, ident), source)


def test_round_trips_are_exact_and_the_1d_subspace_is_the_dii():
    g = torch.Generator().manual_seed(0)
    h, s = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    R, _ = torch.linalg.qr(torch.randn(6, 3, generator=g))
    for f in (Identity(6), Subspace(R), Subspace(R[:, 0])):
        assert isinstance(f, Featurizer)
        assert torch.allclose(f.inverse(*f.featurize(h)), h, atol=1e-6)
        assert torch.allclose(interchange(h, h, f), h, atol=1e-6)  # a vector's own features: no change
    a = R[:, 0]
    assert torch.allclose(interchange(h, s, Subspace(a)), dii(h, s, a), atol=1e-6)
    # k dims: the projection of the source onto span R, the base's part outside it
    P = R @ R.T
    assert torch.allclose(interchange(h, s, Subspace(R)), h @ (torch.eye(6) - P) + s @ P, atol=1e-5)
    # only the masked features move: interchanging feature 0 of R is the 1-D DII along its first column
    assert torch.allclose(interchange(h, s, Subspace(R), torch.tensor([True, False, False])), dii(h, s, a), atol=1e-6)


def test_the_edit_and_its_rowwise_form():
    g = torch.Generator().manual_seed(1)
    h, s = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    sub = Subspace(torch.tensor([0.0, 0.0, 1.0]))
    edit = FeatureInterchange(s, sub).bind(torch.tensor([2, 0]))
    assert torch.allclose(edit(h[:2]), interchange(h[:2], s[[2, 0]], sub))
    group = torch.tensor([0, 1, 2, 0])
    out = rowwise_interchange(s, group, [sub, None, Identity(3)], [None, None, torch.tensor([True, False, False])])(h)
    assert torch.allclose(out[[0, 3]], interchange(h[[0, 3]], s[[0, 3]], sub))
    assert torch.equal(out[1], s[1])  # None: the whole-vector swap
    assert torch.equal(out[2], torch.stack([s[2, 0], h[2, 1], h[2, 2]]))
    assert out.dtype == h.dtype and not torch.equal(out, h)
