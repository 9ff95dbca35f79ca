"""Featurizers: a hidden vector as features plus an error term, and back — the unit a causal variable is localised in.

A :class:`Featurizer` maps site vectors ``h`` (n, d) to ``(features (n, m), error (n, d))`` and back with
``inverse(features, error)``, exactly: ``inverse(*featurize(h)) == h`` (MIB's featurizer and inverse featurizer,
CausalAbstraction's ``Featurizer``; pyvene's rotated-space interventions). An **interchange** on a set of features
(:func:`interchange`) takes those features from a source vector and keeps the base's others and its error term:

- :class:`Identity` (m = d, error 0): the standard basis; every feature is the whole vector's coordinate;
- :class:`Subspace` (orthonormal columns R (d, k), error the part of h outside span R): interchanging every feature
  is the k-dimensional distributed interchange ``h + R Rᵀ (s − h)`` (DAS; k = 1 is CausalGym's 1-D DII);
- an SAE's latents (:mod:`cprobe.sae`: ``features = encode(h)``, ``error = h − decode(features)``; with the error
  term dropped, RAVEL's SAE method decodes the swapped latents alone);
- a learned binary mask over any featurizer's features (DBM) picks which features are interchanged.

:class:`FeatureInterchange` is the edit (:mod:`cprobe.models.edits`) and :func:`rowwise_interchange` the sites
engine's row-wise form, one featurizer and feature mask per group of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from cprobe.models.edits import Edit, EditSpec


@runtime_checkable
class Featurizer(Protocol):
    """Site vectors as features and an error term, and back (module doc)."""

    n_features: int

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(features (n, m), error (n, d)) of ``h`` (n, d)."""
        ...

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        """The site vectors (n, d) of ``features`` with ``error`` added."""
        ...


@dataclass
class Identity:
    """The standard basis: the features are the vector's coordinates, the error is zero."""

    n_features: int

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        return h, torch.zeros_like(h)

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        return features + error


@dataclass
class Subspace:
    """Features = coordinates in the orthonormal columns of ``basis`` (d, k); error = the rest of the vector."""

    basis: Tensor

    def __post_init__(self) -> None:
        if self.basis.dim() == 1:
            self.basis = self.basis[:, None]

    @property
    def n_features(self) -> int:
        return int(self.basis.shape[1])

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        R = self.basis.to(h.device, h.dtype)
        f = h @ R
        return f, h - f @ R.T

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        return features @ self.basis.to(features.device, features.dtype).T + error


def interchange(h_base: Tensor, h_source: Tensor, featurizer: Featurizer, mask: Tensor | None = None) -> Tensor:
    """The base vectors with the features in ``mask`` (m,) bool, default every feature, taken from the source's;
    the base's other features and its error term kept. A float ``mask`` (m,) in [0, 1] is a soft gate, each feature
    ``(1 − g)·f_base + g·f_source`` (DBM's training relaxation). Differentiable in everything it closes over."""
    fb, eb = featurizer.featurize(h_base)
    fs, _ = featurizer.featurize(h_source)
    if mask is None:
        f = fs
    elif mask.dtype == torch.bool:
        f = torch.where(mask.to(fb.device), fs, fb)
    else:
        f = fb + mask.to(fb.device, fb.dtype) * (fs - fb)
    return featurizer.inverse(f, eb)


@dataclass
class FeatureInterchange(EditSpec):
    """Item i's site vector with the ``mask`` features of ``featurizer`` taken from ``source[i]`` (N, d)."""

    source: Tensor
    featurizer: Featurizer
    mask: Tensor | None = None

    def bind(self, rows: Tensor) -> Edit:
        s = self.source[rows.to(self.source.device)]
        return lambda h: interchange(h.float(), s.to(h.device).float(), self.featurizer, self.mask).to(h.dtype)


def rowwise_interchange(source: Tensor, group: Tensor, featurizers: Sequence[Featurizer | None],
                        masks: Sequence[Tensor | None] | None = None) -> Callable[[Tensor], Tensor]:
    """An edit for a chunk of rows: row r interchanged toward ``source[r]`` (n, d) by ``featurizers[group[r]]`` (its
    ``masks[group[r]]`` features); a None featurizer is the whole-vector swap. Each group present runs once."""
    def edit(h: Tensor) -> Tensor:
        out = h.float().clone()
        src = source.to(h.device).float()
        for g in group.unique().tolist():
            rows = (group == g).to(h.device)  # float masks (DBM's gates) keep their gradient through out[rows]
            f = featurizers[g]
            out[rows] = src[rows] if f is None else interchange(
                out[rows], src[rows], f, None if masks is None else masks[g])
        return out.to(h.dtype)
    return edit
