"""Concept-effect explainers (see :mod:`cprobe.explainers.base`); importing the package registers them all."""

from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries

for _m in ("random", "conexp", "approx", "s_learner", "tcav", "conceptshap", "inlp", "leace", "causalm", "matching",
           "intervention"):
    __import__(f"cprobe.explainers.{_m}")

__all__ = ["EXPLAINERS", "ExplainedModel", "Explainer", "Observed", "Queries"]
