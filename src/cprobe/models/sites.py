"""Where representations live, as data: a :class:`Site` names a layer, a position and a stream; a
:class:`Batch` is a tokenized batch carrying the token index of every named position per row.

Layer convention (Hugging Face ``output_hidden_states``): layer 0 is the embedding output, layer l ≥ 1
the output of block l. At the last layer of a model with a final norm (GPT-NeoX, GPT-2, Llama) HF reports
the *normed* state; ``stream="block"`` names the raw output of block L instead (what pyvene calls
``block_output`` and CausalGym's reference reads). Below the last layer the two streams coincide.

Positions are names a formatter defines (``target``, ``first``, ``word:3``, ``region:2``, ``last``,
``object``, ``cls`` ...); a row that lacks a position has index −1 there (reads give zeros, edits skip it).
The reserved position :data:`MEAN` (``"mean"``) reads the mean over a row's real tokens (a sentence embedding,
as sentence-transformers pool); it can be read, not edited.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from cprobe.errors import ConfigError

MEAN = "mean"
Stream = Literal["resid", "block"]
STREAMS: tuple[str, ...] = ("resid", "block")


@dataclass(frozen=True, order=True)
class Site:
    """``hidden_states[layer]`` (or the raw block output, ``stream="block"``) at a named position."""

    layer: int
    position: str = "target"
    stream: Stream = "resid"

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise ConfigError(f"unknown stream {self.stream!r}; choose from {list(STREAMS)}")
        if not isinstance(self.layer, int) or self.layer < 0:
            raise ConfigError(f"a site's layer must be a non-negative integer, got {self.layer!r}")

    @property
    def key(self) -> str:
        """A file-name-safe identity, e.g. ``L3.target`` or ``L6.region-2.block``."""
        pos = self.position.replace(":", "-").replace("/", "_")
        return f"L{self.layer}.{pos}" + (".block" if self.stream == "block" else "")

    def __str__(self) -> str:
        return f"layer {self.layer} @ {self.position}" + (" (block output)" if self.stream == "block" else "")


@dataclass
class Batch:
    """Right-padded token ids plus, per named position, the token index of each row (−1: absent).

    ``rows`` are the indices of these rows in the full item list (edits and readouts use them to pick
    per-row data); ``pred`` names the position whose output token readouts score (None: sequence-level
    readouts only, e.g. a classification head).
    """

    input_ids: Tensor
    attention_mask: Tensor
    positions: dict[str, Tensor]
    rows: Tensor
    pred: str | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def position(self, name: str) -> Tensor:
        try:
            return self.positions[name]
        except KeyError:
            raise ConfigError(f"position {name!r} is not defined for these items; "
                              f"available: {sorted(self.positions)}") from None

    def pred_positions(self) -> Tensor:
        if self.pred is None:
            raise ConfigError("this batch has no prediction position; use a sequence-level readout (class_head)")
        return self.position(self.pred)

    def select(self, idx: Tensor) -> Batch:
        """The sub-batch of rows ``idx`` (positions into this batch), trimmed to its longest row."""
        idx = idx.to(self.input_ids.device)
        mask = self.attention_mask[idx]
        width = int(mask.sum(1).max()) if len(idx) else 0  # right padding: real tokens come first
        return Batch(self.input_ids[idx, :width], mask[:, :width],
                     {k: v[idx.to(v.device)] for k, v in self.positions.items()}, self.rows[idx.to(self.rows.device)],
                     self.pred, {k: v[idx, :width] for k, v in self.extra.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """This batch on ``device`` (``rows`` stay where they are: they index host-side data)."""
        nb = non_blocking
        return Batch(self.input_ids.to(device, non_blocking=nb), self.attention_mask.to(device, non_blocking=nb),
                     {k: v.to(device, non_blocking=nb) for k, v in self.positions.items()}, self.rows, self.pred,
                     {k: v.to(device, non_blocking=nb) for k, v in self.extra.items()})


def pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad token id lists: (ids (n, T), attention mask (n, T))."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask
