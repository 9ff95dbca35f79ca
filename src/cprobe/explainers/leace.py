"""LEACE as an explainer (beyond the CEBaB paper; Belrose et al. 2023): per concept C, the project's LEACE
eraser (:class:`cprobe.interventions.leace.LEACE`) fit on φ of the training split against C's 3-way label;
the estimate is softmax N(E(φ(x))) − softmax N(φ(x)) with the explained head unchanged — what the model does
once no linear readout of C is left. Like INLP it models removal only. It is ``via_leace``
(:mod:`cprobe.explainers.intervention`) with the diagnosis on by default: ``leftover_[C]`` = (accuracy before, after,
majority rate) of a fresh logistic probe for C on training rows an eraser fit on the other half never saw
(:func:`~cprobe.explainers.base.leftover`; a few tenths of a second); ``interventions_[C]`` is C's fitted eraser."""

from __future__ import annotations

from cprobe.explainers.base import EXPLAINERS
from cprobe.explainers.intervention import bridge


@EXPLAINERS.register("leace")
class LEACEExplainer(bridge("leace")):  # type: ignore[misc]
    name = "leace"
    forwards_kwargs_to = ()
    __reduce__ = object.__reduce__  # pickled as itself, not as the bridge it extends

    def __init__(self, seed: int = 0, diagnose: bool = True) -> None:
        super().__init__(seed=seed, diagnose=diagnose)
