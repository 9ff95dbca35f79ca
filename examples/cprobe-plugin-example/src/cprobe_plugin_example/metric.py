"""edit_norm: how large an intervention's edit is, relative to the state it edits."""

from __future__ import annotations

import torch
from torch import Tensor

from cprobe.plugin import LOWER, Metric


def edit_norm(before: Tensor, after: Tensor, z: Tensor, z_target: Tensor | None) -> Tensor:
    """‖x′ − x‖ / ‖x‖ per item (0 where x = 0)."""
    num = (after.double() - before.double()).norm(dim=1)
    den = before.double().norm(dim=1)
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


EDIT_NORM = Metric(
    name="edit_norm", title="relative edit size",
    definition="‖x′ − x‖ / ‖x‖ per scored item, averaged: how far the intervention moves a state, relative to the "
               "state (lower: the same effect from a smaller edit)",
    direction=LOWER, range=(0, None), reference="cprobe-plugin-example (docs/extending.md)", headline=True,
    inputs="edit", fn=edit_norm)
