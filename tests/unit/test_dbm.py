"""DBM (cprobe.directions.dbm): the masked featurizer is the base's masked interchange, the soft gate is the training
relaxation, and training through a toy model finds the feature the output reads."""

from __future__ import annotations

import pytest
import torch

from cprobe.directions import DIRECTIONS
from cprobe.directions.dbm import DBM, Masked
from cprobe.methods import Needs, refusal
from cprobe.models.featurizers import Identity, Subspace, interchange


class Affine:
    """An SAE-like featurizer: features = relu(h W + b), inverse = f D + c + error (affine in the features)."""

    def __init__(self, d: int, m: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.W, self.b = torch.randn(d, m, generator=g), torch.randn(m, generator=g)
        self.D, self.c = torch.randn(m, d, generator=g), torch.randn(d, generator=g)
        self.n_features = m

    def featurize(self, h):
        f = torch.relu(h @ self.W + self.b)
        return f, h - (f @ self.D + self.c)

    def inverse(self, f, e):
        return f @ self.D + self.c + e


@pytest.mark.parametrize("base", [Identity(6), Subspace(torch.linalg.qr(torch.randn(6, 4))[0]), Affine(6, 9)])
def test_masked_featurizer_interchange_is_the_base_masked_interchange(base):
    g = torch.Generator().manual_seed(1)
    hb, hs = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    idx = torch.tensor([0, 2])
    mask = torch.zeros(base.n_features, dtype=torch.bool)
    mask[idx] = True
    want = interchange(hb, hs, base, mask)
    got = interchange(hb, hs, Masked(base, idx))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    f, e = Masked(base, idx).featurize(hb)  # an exact round trip
    torch.testing.assert_close(Masked(base, idx).inverse(f, e), hb, atol=1e-5, rtol=0)


def test_a_soft_gate_mixes_each_feature():
    hb, hs = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[5.0, -2.0, 0.0]])
    out = interchange(hb, hs, Identity(3), torch.tensor([0.25, 1.0, 0.0]))
    torch.testing.assert_close(out, torch.tensor([[2.0, -2.0, 3.0]]))  # 1 + .25·4, the source's, the base's


def test_dbm_learns_the_feature_the_output_reads():
    """Toy model: the output's logits read coordinate 2 of the site vector; the label is the source's class. DBM over
    the standard basis must select coordinate 2, and with a sparsity penalty little else."""
    torch.manual_seed(0)
    n, d, K = 64, 6, 2
    g = torch.Generator().manual_seed(2)
    hb = torch.randn(n, d, generator=g)
    hs = torch.randn(n, d, generator=g)
    target = (hs[:, 2] > 0).long()
    W = torch.zeros(2, d)
    W[1, 2], W[0, 2] = 4.0, -4.0
    bases = [Identity(d)] * K

    def forward(rows, h_source, gates):
        out = []
        for k in range(K):
            edited = interchange(hb[rows], h_source[k], bases[k], gates[k])
            out.append(edited @ W.T)
        return torch.stack(out)

    m = DBM(lr=0.1, batch_size=16, epochs=20, sparsity=0.01)
    masks = m.fit_many(forward, hs[None].repeat(K, 1, 1), target[None].repeat(K, 1), [d, d])
    assert masks.shape == (K, d) and masks[:, 2].all()
    assert int(masks.sum()) <= 2 * K  # the penalty keeps the rest out
    fz = m.featurizer(Identity(d), masks[0])
    assert isinstance(fz, Subspace) and fz.n_features == int(masks[0].sum())
    assert m.losses_.shape == (m.steps(n), K) and m.losses_[-1].mean() < m.losses_[0].mean()


def test_dbm_pca_basis_is_orthonormal_and_complete():
    X = torch.randn(50, 5) @ torch.randn(5, 5)
    B = DBM(basis="pca").basis_featurizer(X)
    torch.testing.assert_close(B.basis.T @ B.basis, torch.eye(5), atol=1e-5, rtol=0)


def test_dbm_is_registered_with_its_capabilities_and_refused_where_a_direction_is_read():
    cls = DIRECTIONS.get("dbm")
    assert cls.causal and cls.feature_mask and not cls.whole_vector
    assert refusal("dbm", "mib.methods", Needs(direction=True, whole_vector=True, feature_mask=True)) is None
    why = refusal("dbm", "ravel.methods", Needs(direction=True, whole_vector=True))
    assert why == ("direction method 'dbm' learns a mask over a featurizer's features, no direction (feature_mask); "
                   "ravel.methods scores a direction, so direction method 'dbm' cannot run in ravel.methods")
    with pytest.raises(ValueError, match="unknown DBM basis 'svd'"):
        DBM(basis="svd")


def test_dbm_fit_one_site_as_das_does():
    """``fit(forward, h_source, target)`` (one site, DAS's signature): the masked featurizer keeps the read feature."""
    g = torch.Generator().manual_seed(3)
    hb, hs = torch.randn(48, 4, generator=g), torch.randn(48, 4, generator=g)
    W = torch.zeros(2, 4)
    W[1, 1], W[0, 1] = 4.0, -4.0
    m = DBM(lr=0.1, batch_size=16, epochs=20, sparsity=0.01).fit(lambda edit, idx: edit(hb[idx]) @ W.T, hs,
                                                                 (hs[:, 1] > 0).long())
    assert bool(m.masks_[0, 1]) and m.featurizer_.n_features >= 1 and isinstance(m.base_, Identity)
    from cprobe.methods import featurizer

    assert featurizer(m) is m.featurizer_  # the shared answer: a fitted method as a featurizer, by its capability
