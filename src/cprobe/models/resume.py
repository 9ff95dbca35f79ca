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
- :class:`Resuming`: the adapter's base — its ``resume``/``kv_resume`` switches, whether and where a pass resumes,
  and :meth:`~Resuming.clean_states`.

The last position of a causal LM (:func:`last_only`, :func:`suffix`): when every edit and read of a pass is at each
row's last real token and the readout scores that token, nothing at positions 0 … last − 1 changes (causal attention
looks back only), so the blocks above the edited layer l need the last token only, attending to the clean keys and
values of the prefix. Clean states built with ``kv=True`` also hold the clean key/value cache of every block above
their lowest layer (:class:`CleanStates` ``kv``; a family declares that its attention takes a cache and explicit
position ids: :attr:`cprobe.models.family.Family.kv_resume`); such a pass then runs one token per row through blocks
l+1 … L. Right padding puts the rows' last tokens at different positions: the step's cache is the prefix's width
P = the longest row's last position, row r's key/value slots ≥ its own last position are masked out, and its token
keeps its own position id (absolute or rotary positions alike), so a padded batch gives the full forward's numbers.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from cprobe.compute import follow_load
from cprobe.errors import ConfigError
from cprobe.models.family import family_of, sliding_window
from cprobe.models.sites import MEAN, Batch, Site

log = logging.getLogger(__name__)

DEVICE_BUDGET = 2 << 30
"""Bytes of clean states kept on an accelerator; more are kept in (pinned) host memory and copied per batch."""

KV_BUDGET = 8 << 30
"""Bytes of a prefix's clean key/value cache kept at most (on the accelerator within :data:`DEVICE_BUDGET`, else in
host memory); past it the cache is not kept and last-position passes resume as any other pass."""

KV = Mapping[int, tuple[Tensor, Tensor]]
"""Clean keys and values (n, heads, T, head_dim) per block l (1 … L) of a causal LM's attention."""


@dataclass
class Resume:
    """The clean block outputs (n, T, d) of one batch's rows at some layers (1 … L), and the model they are of."""

    model: str
    states: Mapping[int, Tensor]
    kv: KV = field(default_factory=dict)
    """The rows' clean key/value cache of the blocks above the resume layer (``CleanStates(kv=True)``; empty: none)."""


class CleanStates:
    """Full-sequence clean states (N, T, d) of N tokenised items at some layers (module doc)."""

    def __init__(self, model: str, input_ids: Tensor, attention_mask: Tensor, states: dict[int, Tensor],
                 kv: dict[int, tuple[Tensor, Tensor]] | None = None) -> None:
        self.model = model
        self.input_ids = input_ids.cpu()
        self.attention_mask = attention_mask.cpu()
        self.states = states
        self.kv = kv or {}
        """Clean keys and values (N, heads, T, head_dim) of the blocks above the lowest layer (module doc)."""

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
        kv = {}
        if keep:
            for l, (k, v) in self.kv.items():
                if l > min(keep):
                    at = items.to(k.device)
                    kv[l] = (k[at, :, :width].to(device, non_blocking=True), v[at, :, :width].to(device, non_blocking=True))
        return Resume(model, out, kv)


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


class KVStore:
    """The clean key/value cache of N items at blocks ``layers``, filled piece by piece from HF ``DynamicCache`` s
    (allocated on the first piece, when heads and head size are known)."""

    def __init__(self, n: int, width: int, layers: Sequence[int], where: torch.device, pin: bool) -> None:
        self.n, self.width, self.layers, self.where, self.pin = n, width, list(layers), where, pin
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}

    def add(self, a: int, cache) -> None:
        """Rows ``a`` … of a piece's cache (each layer's keys and values (b, heads, w, head_dim))."""
        for l in self.layers:
            layer = cache.layers[l - 1]
            k, v = layer.keys, layer.values
            if l not in self.kv:
                shape = (self.n, k.shape[1], self.width, k.shape[3])
                self.kv[l] = tuple(torch.zeros(shape, dtype=t.dtype, device=self.where, pin_memory=self.pin)
                                   for t in (k, v))  # type: ignore[assignment]
            for store, t in zip(self.kv[l], (k, v)):
                store[a:a + t.shape[0], :, :t.shape[2]].copy_(t)


def last_only(batch: Batch, edits: Sequence[Site], read: Sequence[Site], scored: bool) -> Tensor | None:
    """Each row's last real position (n,) when every edit and read of a pass is at it (or absent from the row: −1)
    and, with a readout (``scored``), the prediction position is it in every row; else None (module doc)."""
    mask = batch.attention_mask
    if batch.extra or mask.shape[1] < 2:
        return None
    length = mask.sum(1)
    right = torch.arange(mask.shape[1], device=mask.device)[None] < length[:, None]  # real tokens first
    if not torch.equal(mask.bool(), right):
        return None
    last = length - 1
    names = [s.position for s in (*edits, *read)]
    if MEAN in names:
        return None
    if scored and (batch.pred not in batch.positions  # None (no prediction position) is never a key
                   or not bool((batch.positions[batch.pred].to(last.device) == last).all())):
        return None
    for name in dict.fromkeys(names):
        if name not in batch.positions:
            return None
        pos = batch.positions[name].to(last.device)
        if not bool(((pos == last) | (pos < 0)).all()):
            return None
    return last


def at_last(batch: Batch, edits: Sequence[Site], read: Sequence[Site] = ()) -> bool:
    """Whether passes over ``batch``'s rows edited at ``edits`` and read at ``read`` (scored at its prediction
    position, when it names one) are last-token passes (:func:`last_only`): what a caller asks before keeping the
    prefix's key/value cache (``clean_states(kv=…)``)."""
    return last_only(batch, edits, read, batch.pred is not None) is not None


def suffix(batch: Batch, last: Tensor, resume: Resume, layer: int, states: Tensor, n_layers: int,
           keyword: str) -> tuple[Batch, dict, Tensor]:
    """The one-token step of a last-position pass resumed at ``layer`` (module doc): the batch of each row's last
    token (every position that held it now 0, others −1), the model's keyword arguments (ids, attention mask over
    the prefix cache and the token, position ids, the cache) and the pass-through states (n, 1, d) of block
    ``layer``. Every block above ``layer`` must be in ``resume.kv``."""
    from transformers import DynamicCache

    dev = batch.input_ids.device
    n = len(batch)
    rows = torch.arange(n, device=dev)
    last = last.to(dev)
    width = int(last.max())  # P: the prefix cache's width
    ids = batch.input_ids[rows, last][:, None]
    mask = torch.cat([(torch.arange(width, device=dev)[None] < last[:, None]).to(batch.attention_mask.dtype),
                      torch.ones(n, 1, dtype=batch.attention_mask.dtype, device=dev)], 1)
    positions = {k: torch.where(v.to(dev) == last, torch.zeros_like(last), torch.full_like(last, -1))
                 for k, v in batch.positions.items()}
    step = replace(batch, input_ids=ids, attention_mask=torch.ones_like(ids), positions=positions)
    data = []
    for l in range(1, n_layers + 1):
        if l <= layer:  # a skipped block's slot: never read, sized so the cache reports the prefix's width
            place = torch.zeros(1, 1, 1, 1, dtype=states.dtype, device=states.device).expand(n, 1, width, 1)
            data.append((place, place))
        else:
            k, v = resume.kv[l]
            data.append((k[:, :, :width], v[:, :, :width]))
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": last[:, None],
              keyword: DynamicCache(data), "use_cache": True}
    return step, kwargs, states[torch.arange(n, device=states.device), last.to(states.device)][:, None]


class StopForward(Exception):
    """Raised by the deepest hook a pass needs (no readout after it): ends the model's forward early."""


class Resuming:
    """The resume machinery of :class:`~cprobe.models.adapter.ModelAdapter` (its base): the switches, whether a
    pass can resume, where it resumes, and the clean states it resumes from. What it reads of the adapter is declared
    below; the adapter defines each."""

    name: str
    kind: str
    model: nn.Module
    n_layers: int
    hidden_size: int
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    _main: torch.device | None  # a device map's main device (None: one device)
    _blocks: Sequence[nn.Module]
    _register: Callable[[nn.Module, bool, Callable[[Tensor], Tensor]], Any]  # a forward (pre-)hook patching a tensor
    check_layers: Callable[[Sequence[int]], list[int]]
    token_cap: Callable[..., int | None]

    def _init_resume(self, cfg: Any, model: nn.Module) -> None:
        self.resume = True
        """Let a pass given clean states (``run(resume=…)``, ``map(resume=…)``) resume at its lowest edited or read
        layer, running the blocks above it only (:mod:`cprobe.models.resume`; ``compute.resume``). False runs the full
        forward, for comparison (and :meth:`clean_states` then computes nothing)."""
        self._resumable = family_of(cfg).resumable
        self._said_full = False
        self._said_window = False
        self.kv_resume = True
        """Let a resumed pass edited and read at each row's last token only run that token alone above the edited
        layer, over the prefix's clean key/value cache (clean states built with ``kv=True``; a causal LM whose family
        declares :attr:`~cprobe.models.family.Family.kv_resume`; ``compute.kv_resume``). False resumes it as any other
        pass, for comparison."""
        self._kv_family = family_of(cfg).kv_resume
        self._window = sliding_window(cfg)  # sliding-window layers: the one-token step is exact within it only
        # a HF causal LM's key/value cache argument: ``cache`` since transformers 5.x, before it ``past_key_values``
        self._cache_kw = "" if not self._kv_family else (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values")

    @property
    def can_resume(self) -> bool:
        """Whether passes given clean states resume at their edited layer: :attr:`resume` is on and the family's
        blocks can be swapped (:attr:`Family.resumable <cprobe.models.family.Family.resumable>`)."""
        return self.resume and self._resumable

    @property
    def can_kv_resume(self) -> bool:
        """Whether a resumed last-token pass runs that token alone over the prefix's clean key/value cache
        (:attr:`kv_resume` on, a causal LM whose family declares it, passes can resume)."""
        return (self.kv_resume and self._kv_family and self.kind == "causal" and self._main is None  # one device
                and self.can_resume)

    def _within_window(self, last: Tensor) -> bool:
        """Whether a one-token step at each row's ``last`` position sees what the full forward sees under the model's
        sliding window: the step runs at the prefix's width P = max(last), where the window's mask keeps keys at
        positions > P − window; every row's keys 0 … last are kept, as in the full forward, while P < window."""
        if self._window is None or int(last.max()) < self._window:
            return True
        if not self._said_window:
            log.info("%s: inputs reach past its %d-token sliding window; last-token passes run every token above the "
                     "edited layer", self.name, self._window)
            self._said_window = True
        return False

    def _resume_at(self, resume: Resume | None, lowest: int, batch: Batch) -> tuple[int, Tensor] | None:
        """(layer, states) to resume this pass at, or None for the full forward."""
        if resume is None or not self.resume:
            return None
        if not self._resumable:
            if not self._said_full:
                log.info("%s: model family %r cannot resume at an edited layer (its blocks are not known to take "
                         "and return one tensor); running full forwards", self.name, self.model.config.model_type)
                self._said_full = True
            return None
        if resume.model != self.name:
            raise ConfigError(f"clean states of model {resume.model!r} cannot resume a pass of {self.name!r}")
        # the deepest layer held at or below the pass's lowest hooked depth (none: the full forward runs)
        layer = max((l for l in resume.states if 1 <= l <= min(lowest, self.n_layers)), default=None)
        if layer is None:
            return None
        states = resume.states[layer]
        want = (*batch.input_ids.shape, self.hidden_size)
        if tuple(states.shape) != want:
            raise ConfigError(f"clean states {tuple(states.shape)} do not fit this batch {want}; take them for "
                              "its rows (CleanStates.take)")
        return layer, states.to(self.dtype)

    def clean_states(self, batch: Batch, layers: Sequence[int], kv: bool = False) -> CleanStates:
        """The clean full-sequence states of ``batch``'s rows at ``layers`` (block
        outputs; layer 0 needs none), for edited passes over these items to resume from (:mod:`cprobe.models.resume`).

        Computed in pieces of at most ``batch_size`` rows (and the token cap), each stopping after the deepest layer;
        kept in the model's dtype on its device, or in host memory past :data:`~cprobe.models.resume.DEVICE_BUDGET`.
        Nothing is computed when passes cannot resume (:attr:`can_resume`): the passes then run in full.

        ``kv``: also keep the clean key/value cache of every block above the lowest layer (:attr:`can_kv_resume`,
        within :data:`~cprobe.models.resume.KV_BUDGET`), for passes edited and read at the last token only; the
        pieces then run to the last block."""
        sub = batch.to("cpu")
        layers = [l for l in self.check_layers(layers) if l >= 1] if self.can_resume else []
        if not layers:
            return CleanStates(self.name, sub.input_ids, sub.attention_mask, {})
        n, width = sub.input_ids.shape
        size = len(layers) * n * width * self.hidden_size * self.dtype.itemsize
        dev = self.device
        where = dev if dev.type == "cpu" or size <= DEVICE_BUDGET else torch.device("cpu")
        pin = where.type == "cpu" and dev.type == "cuda"
        store = {l: torch.zeros(n, width, self.hidden_size, dtype=self.dtype, device=where, pin_memory=pin)
                 for l in layers}
        kvs = self._kv_store(n, width, min(layers), size) if kv else None
        deepest = self.n_layers if kvs else max(layers)  # the prefix's cache: every block above the lowest layer
        cap = self.token_cap()
        step = max(1, min(self.batch_size, cap // max(width, 1) if cap else self.batch_size))
        for a in range(0, n, step):
            piece = sub.select(torch.arange(a, min(a + step, n))).to(dev)
            w = piece.input_ids.shape[1]

            def keep(layer: int) -> Callable[[Tensor], Tensor]:
                def patch(h: Tensor) -> Tensor:
                    if layer in store:
                        store[layer][a:a + len(piece), :w].copy_(h)  # to the host: synchronous, so safe to reuse
                    if layer == deepest:
                        raise StopForward
                    return h
                return patch
            handles = [self._register(self._blocks[l - 1], False, keep(l)) for l in sorted({*layers, deepest})]
            extra = dict(piece.extra)
            if kvs is not None:
                from transformers import DynamicCache

                extra.update({self._cache_kw: DynamicCache(), "use_cache": True})
            follow_load()  # the passes' threads: the cores other work leaves free (compute.follow_load)
            try:
                with torch.no_grad():  # not inference tensors: a resumed pass may train through them (DAS)
                    self.model(input_ids=piece.input_ids, attention_mask=piece.attention_mask, **extra)
            except StopForward:
                pass
            finally:
                for hd in handles:
                    hd.remove()
            if kvs is not None:
                kvs.add(a, extra[self._cache_kw])
        return CleanStates(self.name, sub.input_ids, sub.attention_mask, store, kvs.kv if kvs else None)

    def _kv_store(self, n: int, width: int, low: int, states_size: int) -> KVStore | None:
        """Where the clean key/value cache of blocks low+1 … L goes (:meth:`clean_states` ``kv``), or None: the model
        cannot use it, no block is above ``low``, or it is past :data:`~cprobe.models.resume.KV_BUDGET`."""
        if not self.can_kv_resume or low >= self.n_layers:
            return None
        size = 2 * (self.n_layers - low) * n * width * self.hidden_size * self.dtype.itemsize  # at most: no GQA
        if size > KV_BUDGET:
            log.info("%s: the prefix's key/value cache (%.1f GiB) is past the budget; last-token passes resume "
                     "without it", self.name, size / 2**30)
            return None
        dev = self.device
        where = dev if dev.type == "cpu" or states_size + size <= DEVICE_BUDGET else torch.device("cpu")
        return KVStore(n, width, range(low + 1, self.n_layers + 1), where, where.type == "cpu" and dev.type == "cuda")
