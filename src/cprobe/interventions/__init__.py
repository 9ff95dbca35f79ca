"""Interventions on hidden states, selected by config name (``INTERVENTIONS``)."""

from __future__ import annotations

from cprobe.interventions import (  # noqa: F401
    alterrep, autoattack, direction, fgsm, inlp, leace, mean_diff, pgd, rlace, sae_latents)
from cprobe.interventions.base import INTERVENTIONS, Intervention, apply, fit_intervention, needs_goal

__all__ = ["INTERVENTIONS", "Intervention", "apply", "fit_intervention", "needs_goal"]
