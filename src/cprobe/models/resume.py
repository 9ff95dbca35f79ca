"""Resuming a forward pass at an edited layer: an edit at layer l changes nothing below l, so an edited pass that
starts from the clean states at l runs blocks l+1 … L only — (L − l)/L of a full forward (and of its backward in DAS).

The model's own forward still runs (so attention masks, position ids and rotary embeddings are built by the model
itself, for every family alike); only the transformer blocks 1 … l are swapped, for the duration of the pass, for a
pass-through that returns the given clean states — block l's output, where the edit's hook then fires as it does in
a full pass. A family declares that its blocks can be swapped (:attr:`cprobe.models.family.Family.resumable`: each
block takes the hidden states and returns them as one tensor); any other family runs the full forward (one log line).

- :class:`CleanStates`: the full-sequence clean states (N, T, d) of a tokenised item set at some layers (block
  outputs, in the model's dtype, on its device or — past a memory budget — on the CPU), keyed by the model and the
  token ids and attention mask they were computed on; built by :meth:`ModelAdapter.clean_states
  <cprobe.models.adapter.ModelAdapter.clean_states>` in pieces of ``batch_size`` rows, each stopping after the
  deepest layer asked for.
- :meth:`CleanStates.take`: the :class:`Resume` of one batch of those items (a sub-batch, trimmed to its longest
  row), after checking the batch is the same tokens of the same model (otherwise a ``ConfigError``: never wrong
  numbers).
- :class:`Resume`: what :meth:`ModelAdapter.run <cprobe.models.adapter.ModelAdapter.run>` takes (``resume=``): the
  batch's clean states per layer; the pass resumes at the deepest of them at or below its lowest edited or read
  site.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError

DEVICE_BUDGET = 2 << 30
"""Bytes of clean states kept on an accelerator; more are kept in (pinned) host memory and copied per batch."""


@dataclass
class Resume:
    """The clean block outputs (n, T, d) of one batch's rows at some layers (1 … L), and the model they are of."""

    model: str
    states: Mapping[int, Tensor]

    def layer_for(self, lowest: int) -> int | None:
        """The layer to resume at for a pass whose lowest hooked depth is ``lowest``: the deepest layer held at or
        below it (None: none, the full forward runs)."""
        held = [l for l in self.states if 1 <= l <= lowest]
        return max(held) if held else None


class CleanStates:
    """Full-sequence clean states (N, T, d) of N tokenised items at some layers (module doc)."""

    def __init__(self, model: str, input_ids: Tensor, attention_mask: Tensor, states: dict[int, Tensor]) -> None:
        self.model = model
        self.input_ids = input_ids.cpu()
        self.attention_mask = attention_mask.cpu()
        self.states = states

    @property
    def layers(self) -> list[int]:
        return sorted(self.states)

    def take(self, items: Tensor, batch_ids: Tensor, batch_mask: Tensor, model: str,
             device: torch.device, layers: Sequence[int] | None = None) -> Resume:
        """The :class:`Resume` of the batch whose row r is item ``items[r]`` (token ids and mask as given, right-
        padded to their own width), on ``device``; a ``ConfigError`` when the states are of another model or other
        tokens (the cache key: model and token ids)."""
        if model != self.model:
            raise ConfigError(f"clean states of model {self.model!r} cannot resume a pass of {model!r}")
        items = items.cpu()
        width = int(batch_ids.shape[1])
        ids, mask = batch_ids.cpu(), batch_mask.cpu()
        if (width > self.input_ids.shape[1] or not torch.equal(self.input_ids[items, :width] * mask, ids * mask)
                or not torch.equal(self.attention_mask[items, :width], mask)
                or bool(self.attention_mask[items, width:].any())):
            raise ConfigError("clean states were computed on other tokens than this batch's (another tokenisation "
                              "or item order); recompute them for these items")
        keep = self.layers if layers is None else [l for l in layers if l in self.states]
        out = {}
        for l in keep:
            st = self.states[l]
            out[l] = st[items.to(st.device), :width].to(device, non_blocking=True)
        return Resume(model, out)


@contextlib.contextmanager
def skipped(blocks: nn.ModuleList, layer: int, states: Tensor) -> Iterator[None]:
    """Within the block, blocks 1 … ``layer`` do not compute: each returns ``states`` (n, T, d), the clean output
    of block ``layer`` (forward hooks on them still fire, so an edit or read at ``layer`` sees these states)."""

    def through(*_args, **_kwargs) -> Tensor:
        return states

    swapped = [(b, b.__dict__.get("forward")) for b in blocks[:layer]]  # a device map's hooks set their own
    for b, _ in swapped:
        b.forward = through  # an instance attribute shadows the class's forward for this pass only
    try:
        yield
    finally:
        for b, own in swapped:
            if own is None:
                del b.forward
            else:
                b.forward = own
