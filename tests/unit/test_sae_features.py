"""RAVEL's SAE method (``sae_features``, cprobe.directions.sae_features): an SAE's selected latents as a featurizer
(cprobe.sae.features.SAELatents) with and without the SAE's error term, the L1-classifier selection against
scikit-learn's own ``SelectFromModel`` (explanare/ravel ``select_features_with_classifier``), the SAE trained on the
broad states, and the capability that keeps it out of the studies that score one direction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cprobe.directions import DIRECTIONS
from cprobe.directions.base import capability_problems
from cprobe.methods import MethodError, Needs, check
from cprobe.models.featurizers import Featurizer, interchange
from cprobe.sae import store
from cprobe.sae.dictionary import SAE
from cprobe.sae.features import SAELatents
from cprobe.sae.select import l1_classifier
from cprobe.sae.train import TrainSettings


def _sae(d: int = 6, m: int = 10, seed: int = 0) -> SAE:
    g = torch.Generator().manual_seed(seed)
    return SAE(torch.randn(d, m, generator=g), torch.randn(m, generator=g) * 0.1, torch.randn(m, d, generator=g),
               torch.randn(d, generator=g), activation="relu")


def test_with_the_error_term_only_the_chosen_latents_move():
    sae, S = _sae(), torch.tensor([1, 4, 7])
    g = torch.Generator().manual_seed(1)
    hb, hs = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    f = SAELatents(sae, S, keep_error=True)
    assert isinstance(f, Featurizer) and f.n_features == 3
    torch.testing.assert_close(f.inverse(*f.featurize(hb)), hb)  # exact
    moved = interchange(hb, hs, f)
    want = hb + (sae.encode(hs)[:, S] - sae.encode(hb)[:, S]) @ sae.W_dec[S]
    torch.testing.assert_close(moved, want)
    torch.testing.assert_close(moved, sae.edit(hb, S, sae.encode(hs)[:, S]))  # SAE.edit's convention


def test_without_the_error_term_the_swapped_latents_are_decoded_alone():
    """The reference's AutoencoderIntervention: z = encode(base); z[S] = encode(source)[S]; decode(z)."""
    sae, S = _sae(), torch.tensor([0, 3])
    g = torch.Generator().manual_seed(2)
    hb, hs = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    f = SAELatents(sae, S, keep_error=False)
    z = sae.encode(hb).clone()
    z[:, S] = sae.encode(hs)[:, S]
    torch.testing.assert_close(interchange(hb, hs, f), sae.decode(z))
    # no latent swapped: the base becomes the SAE's reconstruction, not itself
    none = SAELatents(sae, torch.zeros(0, dtype=torch.long), keep_error=False)
    torch.testing.assert_close(interchange(hb, hs, none), sae.decode(sae.encode(hb)))
    assert not torch.allclose(interchange(hb, hs, none), hb)


def test_the_l1_classifier_keeps_what_select_from_model_keeps():
    from sklearn.feature_selection import SelectFromModel
    from sklearn.svm import LinearSVC

    g = torch.Generator().manual_seed(0)
    n, m = 300, 40
    z = torch.arange(n) % 3
    F = torch.rand(n, m, generator=g)
    F[:, 5] += 2.0 * (z == 1)  # planted: latent 5 marks class 1, latent 11 class 2
    F[:, 11] += 2.0 * (z == 2)
    for C in (0.01, 0.1, 1.0):
        kept = l1_classifier(F, z, C)
        svm = LinearSVC(C=C, penalty="l1", dual=False, max_iter=5000, tol=0.01, random_state=0).fit(
            F.double().numpy(), z.numpy())
        np.testing.assert_array_equal(kept.numpy(), np.flatnonzero(SelectFromModel(svm, prefit=True).get_support()))
    few, many = l1_classifier(F, z, 0.01), l1_classifier(F, z, 1.0)
    assert {5, 11} <= set(few.tolist()) and len(few) < len(many)
    with pytest.raises(ValueError, match="two classes"):
        l1_classifier(F, torch.zeros(n, dtype=torch.long), 0.1)


def test_the_method_trains_its_sae_on_the_broad_states_and_is_its_featurizer():
    g = torch.Generator().manual_seed(3)
    X, contexts = torch.randn(60, 8, generator=g), torch.randn(200, 8, generator=g) * 3
    y = torch.arange(60) % 3
    X[:, 0] += 3.0 * y
    method = DIRECTIONS.build({"name": "sae_features", "C": 0.5, "d_sae": 16, "epochs": 2, "cache": False}, seed=0)
    assert not isinstance(method, Featurizer)  # not before it is fitted
    method.fit(X, y, contexts=contexts)
    want, _ = store.trained(contexts, TrainSettings(architecture="relu", d_sae=16, epochs=2, seed=0), None)
    torch.testing.assert_close(method.sae_.W_enc, want.W_enc)  # the contexts' SAE, not X's
    assert isinstance(method, Featurizer) and method.n_features == len(method.latents_) > 0
    torch.testing.assert_close(interchange(X[:4], X[4:8], method), interchange(X[:4], X[4:8], method.featurizer_))
    assert not method.keep_error  # the reference's default: no error term


def test_a_features_method_is_refused_where_one_direction_is_scored():
    with pytest.raises(MethodError, match="learns features, not one direction"):
        check(["mean", "sae_features"], "causalgym.methods", Needs(direction=True))
    check(["mean", "sae_features", "vanilla"], "ravel.methods", Needs(direction=True, whole_vector=True, features=True))
    assert DIRECTIONS.get("sae_features").features and capability_problems(DIRECTIONS.get("sae_features")) == []

    class Both(DIRECTIONS.get("vanilla")):
        features = True

    assert any("contradicts" in p for p in capability_problems(Both))
    with pytest.raises(Exception, match="C"):
        DIRECTIONS.build({"name": "sae_features", "C": 0}, seed=0)
