"""Hand-computed cases for the concept-effect distances and the general item types."""

from __future__ import annotations

import numpy as np
import pytest

from cprobe.data.items import CounterfactualPair, TextItem, fingerprint
from cprobe.errors import ConfigError, DataError
from cprobe.metrics.icace import cosine, distance, icace, icace_error, l2, normdiff


def test_distances_on_hand_computed_vectors():
    a = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    b = np.array([[0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [-2.0, -2.0]])
    np.testing.assert_allclose(l2(a, b), [5.0, np.sqrt(5.0), 0.0, np.sqrt(18.0)])
    # 1 - cos; 1 whenever either side is the zero vector (CEBaB's convention: Random scores ~1)
    np.testing.assert_allclose(cosine(a, b), [1.0, 1.0, 1.0, 2.0])
    np.testing.assert_allclose(normdiff(a, b), [5.0, 1.0, 0.0, np.sqrt(2.0)])
    np.testing.assert_allclose(cosine([[1.0, 2.0]], [[2.0, 4.0]]), [0.0], atol=1e-12)
    np.testing.assert_allclose(cosine([[1.0, 0.0]], [[1.0, 1.0]]), [1 - 1 / np.sqrt(2)])


def test_icace_is_counterfactual_minus_base_and_error_dispatches():
    p = np.array([[0.7, 0.2, 0.1]])
    q = np.array([[0.1, 0.3, 0.6]])
    np.testing.assert_allclose(icace(p, q), [[-0.6, 0.1, 0.5]])
    est = np.array([[-0.6, 0.1, 0.5]])
    assert icace_error(icace(p, q), est, "l2")[0] == pytest.approx(0.0)
    assert icace_error(icace(p, q), -est, "cosine")[0] == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="unknown distance 'manhattan'; choose from"):
        distance("manhattan")
    with pytest.raises(ValueError):
        l2(np.zeros((2, 3)), np.zeros((2, 2)))


def test_items_and_pairs():
    base = TextItem("r1", "the food was great", concepts={"food": "Positive", "service": "unknown"}, outcome="5")
    edit = TextItem("r1e", "the food was awful", concepts={"food": "Negative", "service": "unknown"}, outcome="2")
    pair = CounterfactualPair("p1", base, edit, ("food",))
    assert pair.changes == {"food": ("Positive", "Negative")}
    assert pair.swap().changes == {"food": ("Negative", "Positive")}
    assert fingerprint([pair]) != fingerprint([pair.swap()])
    assert fingerprint([base, edit]) == fingerprint([base, edit]) != fingerprint([edit, base])
    with pytest.raises(DataError, match="missing from base or source"):
        CounterfactualPair("p2", base, edit, ("ambiance",))
    with pytest.raises(DataError, match="do not join"):
        TextItem("x", "ab", regions=("a", "c"))
