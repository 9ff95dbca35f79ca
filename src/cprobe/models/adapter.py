"""The one model entry point: :meth:`ModelAdapter.run` (one batch) and :meth:`ModelAdapter.map` (an item list)
read any set of sites and apply any set of edits in one forward pass, scored by a readout.

Tokenisation and site alignment are the formatters' (:mod:`cprobe.models.formatters`), what the output is
read as the readouts' (:mod:`cprobe.models.readouts`), what an edit does :mod:`cprobe.models.edits`'.
Layer convention (as HF ``output_hidden_states``): layer 0 is the embedding output, layer l ≥ 1 the
output of block l; at the last layer of a model with a final norm the ``resid`` stream is the normed state
the LM head reads and the ``block`` stream the raw block output (:class:`~cprobe.models.sites.Site`).
*Writing* at a site replaces exactly that tensor at the given positions and lets the rest of the model run,
so read → write round-trips are exact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from cprobe.compute import follow_load
from cprobe.errors import ConfigError
from cprobe.models.batching import BatchLimits, Prefetcher, device_label, is_oom, plan_batches
from cprobe.models.bos import start_token, token_id
from cprobe.models.edits import Edit, EditSpec, Replace
from cprobe.models.family import GENERIC_FINAL_NORMS, MODEL_FAMILIES, family_of
from cprobe.models.head import Head
from cprobe.models.placement import main_device, placement_label
from cprobe.models.readouts import Readout
from cprobe.models.resume import CleanStates, Resume, Resuming, StopForward, last_only, skipped, suffix
from cprobe.models.sites import MEAN, Batch, Site
from cprobe.progress import Progress

if TYPE_CHECKING:  # pragma: no cover
    from cprobe.models.formatters import Formatter

log = logging.getLogger(__name__)

Kind = Literal["mlm", "causal", "encoder", "classifier"]

@dataclass
class Chunk:
    """Results of one batch of :meth:`ModelAdapter.stream`: its window, its rows (indices into the item list), the
    read states per site (b, d) on the CPU, and the readout's scores (b, ...) or None."""

    window: int
    rows: Tensor
    acts: dict[Site, Tensor]
    scores: Tensor | None


@dataclass
class RunOutput:
    """What one pass returns: the hidden states read at each site (n, d) and the readout's scores (n, k)."""

    acts: dict[Site, Tensor]
    scores: Tensor | None


_SCORED = "_scored"  # the position name of the head's single gathered token


def _gather_rows(pred: Tensor) -> Callable[..., Any]:
    """A forward pre-hook for the output head: its input (n, T, d) becomes (n, 1, d), each row's token at ``pred``
    (n,) — or (n, m, d), the tokens at ``pred`` (n, m) — (the head then computes n (× m) rows of logits, not n × T)."""

    def take(h: Tensor) -> Tensor:
        rows = torch.arange(h.shape[0], device=h.device)
        at = pred.to(h.device)
        return h[rows, at][:, None] if at.dim() == 1 else h[rows[:, None], at]

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (take(args[0]), *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: take(kwargs[key])}
    return hook


def _put(scores: Tensor | None, n: int, rows: Tensor, part: Tensor) -> Tensor:
    """``scores`` (n, ...) — allocated on the first part, in its dtype — with ``part`` written at ``rows``."""
    if scores is None:
        scores = torch.zeros((n, *part.shape[1:]), dtype=part.dtype)
    scores[rows] = part
    return scores


def _pinned(t: Tensor) -> Tensor:
    """A non-blocking copy of ``t`` into pinned host memory (ready once a CUDA event recorded after it is)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def model_positions(config) -> int | None:
    """How many token positions the model can take (None when its config does not say)."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n and config.model_type in MODEL_FAMILIES:
        n -= MODEL_FAMILIES[config.model_type].position_offset  # RoBERTa: position ids start after the padding index
    return int(n) if n else None


_LENGTH_LISTS = 4
"""Lists of texts whose token lengths a :class:`ModelAdapter` keeps (:meth:`ModelAdapter.token_lengths`)."""


class ModelAdapter(Resuming):
    """Wraps an HF model + fast tokenizer. Build with :func:`cprobe.models.load.load_adapter`."""

    def __init__(self, model: nn.Module, tokenizer, kind: Kind, name: str, batch_size: int = 32,
                 layers_path: str | None = None, max_length: int = 256, batch_tokens: int | None = None,
                 limits: BatchLimits | None = None, prefetch: bool | None = None, bos: str = "auto",
                 weights: str | None = None) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tok = tokenizer
        self.kind = kind
        self.name = name
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens  # padded tokens per batch (None: rows only)
        self.limits = limits or BatchLimits()  # sizes learnt from out-of-memory errors
        self.prefetch = prefetch  # build batches on a background thread (None: on CUDA devices only)
        self.max_length = min(max_length, model_positions(model.config) or max_length)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token or self.tok.unk_token
        self.bos = start_token(self.tok, bos, kind, name)
        """The token every input of a causal LM starts with (``model.bos``; None: none, or not a causal LM whose
        inputs the tokenizer's own special tokens frame): :mod:`cprobe.models.bos`."""
        self.bos_id = token_id(self.tok, self.bos)
        self.weights = weights or str(next(model.parameters()).dtype).removeprefix("torch.")
        """What the weights are, for the records: their dtype, or how they were made (e.g. "gguf Q4_K_M dequantised
        to float32")."""
        # the padding side is not set here: the formatters pad right per call (formatters._tokenize), so a tokenizer
        # shared with a library that pads left (nnsight) works for both
        cfg = model.config
        self.n_layers: int = cfg.num_hidden_layers
        self.hidden_size: int = cfg.hidden_size
        self._base = getattr(model, "base_model", model)
        self._main = main_device(model)  # a device map's main device (None: the model is on one device)
        self._where = placement_label(model)  # the devices a device map spans, for remembered batch limits
        self._blocks = self._find_blocks(layers_path)
        self._final_norm = self._find_final_norm()
        self._head = self._find_head()
        self.head = Head.of(model) if kind in ("mlm", "causal") else None
        """The LM head split at its vocabulary projection (:mod:`cprobe.models.head`), or None where the family does not
        declare it (``split_head``): a readout of a few tokens (``Readout.token_ids``) then computes those rows only."""
        self.head_rows = True
        """Compute only the rows of the head a readout reads (above); False runs the full head, for comparison."""
        self.scored_positions = True
        """Apply the output head to the scored position of each row only (a readout that scores one position per
        row: ``Readout.at_position``), not to every token: the same scores for a fraction of the head's work. False
        runs the head at every position, for comparison."""
        self._init_resume(cfg, model)
        self._memo: dict[Any, Any] = {}  # tokenizer answers a sweep's jobs ask again (token_lengths, candidate_id)
        self._memo_tok = self.tok  # whose answers they are: another tokenizer set on the adapter starts afresh

    # ----------------------------------------------------------------- structure
    @property
    def device(self) -> torch.device:
        """Where inputs go and results are gathered: the model's device, or a device-mapped model's main device (its
        first GPU, else the CPU; :mod:`cprobe.models.placement`)."""
        return self._main or next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _find_blocks(self, layers_path: str | None) -> nn.ModuleList:
        path = layers_path or family_of(self.model.config).blocks
        if path is not None:
            try:
                blocks = self._base.get_submodule(path)
            except AttributeError:
                raise ConfigError(f"model {self.name!r} has no module {path!r}; set model.layers_path") from None
        else:
            lists = [m for m in self._base.modules() if isinstance(m, nn.ModuleList) and len(m) == self.n_layers]
            if not lists:
                raise ConfigError(f"cannot find the transformer blocks of model type "
                                  f"{self.model.config.model_type!r}; supported: {sorted(MODEL_FAMILIES)}; or set "
                                  "model.layers_path (e.g. 'encoder.layer')")
            blocks = lists[0]
        if len(blocks) != self.n_layers:
            raise ConfigError(f"{self.name}: found {len(blocks)} blocks but config says {self.n_layers}")
        return blocks

    def _find_final_norm(self) -> nn.Module | None:
        family = family_of(self.model.config)
        if self.kind == "mlm" or not (family.final_norm or family.derived):
            return None
        for n in (family.final_norm,) if family.final_norm else GENERIC_FINAL_NORMS:
            m = getattr(self._base, n, None)
            if isinstance(m, nn.Module):
                return m
        return None

    def _find_head(self) -> nn.Module | None:
        """The module mapping the last hidden state to logits (BERT's ``cls``, NeoX's ``lm_head``...)."""
        if self.kind == "encoder":
            return None
        heads = [m for n, m in self.model.named_children() if m is not self._base]
        return heads[0] if len(heads) == 1 else None

    def check_layers(self, layers: Sequence[int]) -> list[int]:
        bad = [l for l in layers if not 0 <= l <= self.n_layers]
        if bad:
            raise ConfigError(f"layer(s) {bad} out of range for {self.name}: valid layers are 0 (embeddings) … "
                              f"{self.n_layers}")
        return sorted(set(layers))

    # ----------------------------------------------------------------- tokenization
    @staticmethod
    def word_token(tokenizer: Any, word: str) -> int | None:
        """The one rule for "one word, one token": the token id of ``word`` as it follows a space in running text,
        or None when it is not one token. A space-prefixed encoding covers WordPiece (``" Paris"`` → ``Paris``),
        byte-level BPE (``Ġparis``) and word-level vocabularies alike; an unknown word maps to the UNK token, which
        counts as not in the vocabulary."""
        ids = tokenizer.encode(" " + word, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None) else None

    def candidate_id(self, word: str) -> int | None:
        """Token id of ``word`` as the next/masked word (:meth:`word_token`), or None when it is not a single token."""
        key = ("candidate", word)
        if key not in self._tokenizer_memo():
            self._memo[key] = self.word_token(self.tok, word)
        return self._memo[key]

    def _tokenizer_memo(self) -> dict[Any, Any]:
        if self._memo_tok is not self.tok:
            self._memo.clear()
            self._memo_tok = self.tok
        return self._memo

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        """How many tokens each text takes, special tokens included; the answer for the last few lists of texts is
        kept (the jobs of a sweep in one process check the same items against the same tokenizer)."""
        key = ("lengths", tuple(texts))
        if key not in self._tokenizer_memo():
            for old in [k for k in self._memo if k[0] == "lengths"][:1 - _LENGTH_LISTS]:  # keep the newest ones
                del self._memo[old]
            start = self.bos_id is not None
            special = self.kind != "causal"  # a causal LM's inputs: its start token, not the tokenizer's specials
            self._memo[key] = [len(ids) + start for ids in self.tok(list(texts), add_special_tokens=special)[
                "input_ids"]] if texts else []
        return list(self._memo[key])

    # ----------------------------------------------------------------- the one entry point
    def hook_point(self, site: Site) -> tuple[nn.Module, bool]:
        """(module, is_pre_hook) whose output (input, for a pre-hook) is the site's tensor (n, T, d)."""
        if not 0 <= site.layer <= self.n_layers:
            raise ConfigError(f"layer {site.layer} out of range for {self.name}: valid layers are 0 (embeddings) "
                              f"… {self.n_layers}")
        if site.layer == 0:
            return self._blocks[0], True
        if site.layer == self.n_layers and self._final_norm is not None and site.stream == "resid":
            return self._final_norm, False
        return self._blocks[site.layer - 1], False

    def run(self, batch: Batch, read: Sequence[Site] = (), edits: Mapping[Site, Edit] | None = None,
            readout: Readout | None = None, grad: bool = False, resume: Resume | None = None) -> RunOutput:
        """One forward pass over ``batch``: apply every edit at its site, read every ``read`` site (after the
        edits at that site), and score the output with ``readout``.

        ``edits`` are bound to this batch (see :meth:`EditSpec.bind`): each receives the (n, d) site vectors
        of all rows and returns their new values; rows whose position is absent (−1) are left unchanged and
        read as zeros. With ``grad`` the pass is differentiable in whatever the edits close over (DAS);
        otherwise it runs under ``torch.inference_mode``. Tensors come back on the model's device (a device-mapped
        model's main device: each edit runs on the device of the module it hooks, and the read states are gathered).

        ``resume`` (:meth:`CleanStates.take`) holds this batch's clean states at some layers: the pass then starts at
        the deepest of them at or below its lowest edited or read site — blocks below it do not run — with the same
        results as the full forward (:mod:`cprobe.models.resume`).
        """
        follow_load()  # the passes' threads: the cores other work leaves free (compute.follow_load)
        edits = dict(edits or {})
        if readout is not None and self.kind == "encoder":
            raise ConfigError(f"model {self.name!r} has no output head; it can be read but not scored")
        points: dict[tuple[int, bool], tuple[nn.Module, bool, list[Site], list[Site]]] = {}

        def point(s: Site) -> tuple[nn.Module, bool, list[Site], list[Site]]:
            module, pre = self.hook_point(s)
            return points.setdefault((id(module), pre), (module, pre, [], []))

        for s in edits:
            point(s)[2].append(s)
        for s in dict.fromkeys(read):  # read after the edits at the same site: what the model sees
            point(s)[3].append(s)
        dev = self.device
        batch = batch.to(dev)
        acts: dict[Site, Tensor] = {}
        order = list(points)
        depth = {k: self._depth(points[k][0], points[k][1]) for k in order}
        last_read = max((k for k in order if points[k][3]), key=depth.__getitem__, default=None)
        stop_early = readout is None and not grad and last_read is not None and all(
            depth[k] <= depth[last_read] for k in order)
        start = self._resume_at(resume, min(depth.values(), default=self.n_layers + 1), batch)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, **batch.extra}
        if start and resume is not None and resume.kv and self.can_kv_resume:
            # every edit and read at the last token, the readout too: that token alone runs above the resume layer
            last = last_only(batch, list(edits), read, readout is not None)
            if (last is not None and all(l in resume.kv for l in range(start[0] + 1, self.n_layers + 1))
                    and self._within_window(last)):
                batch, inputs, states = suffix(batch, last, resume, start[0], start[1], self.n_layers, self._cache_kw)
                start = (start[0], states)

        def make(key):
            _module, _pre, edit_sites, read_sites = points[key]

            def patch(h: Tensor) -> Tensor:
                n = h.shape[0]
                rows = torch.arange(n, device=h.device)
                for s in edit_sites:
                    if s.position == MEAN:
                        raise ConfigError(f"the pooled position {MEAN!r} can be read but not edited")
                    pos = batch.position(s.position).to(h.device)  # a no-op unless a device map put the block there
                    at = pos.clamp(min=0)
                    old = h[rows, at]
                    new = edits[s](old).to(h.device, h.dtype)
                    # rows without the position keep their vector (no boolean indexing: no host sync per pass)
                    h = h.index_put((rows, at), torch.where((pos >= 0)[:, None], new, old))
                for s in read_sites:
                    if s.position == MEAN:  # the masked mean over the row's real tokens (sentence embeddings)
                        m = batch.attention_mask.to(h.device, h.dtype)[:, :, None]
                        acts[s] = ((h * m).sum(1) / m.sum(1).clamp(min=1)).to(dev)
                        continue
                    pos = batch.position(s.position).to(h.device)
                    v = h[rows, pos.clamp(min=0)]
                    acts[s] = torch.where((pos >= 0)[:, None], v, torch.zeros_like(v)).to(dev)  # gathered
                if stop_early and key == last_read:
                    raise StopForward
                return h
            return patch

        handles = [self._register(points[k][0], points[k][1], make(k)) for k in order]
        scored, gathered = batch, False
        # the head at the scored positions only: a readout that scores one position per row, a head module of its
        # own, the batch's prediction position named (rows without it keep −1 there, so the readout raises its own
        # error; nothing is read back from the device)
        at_pred = (readout is not None and readout.at_position and batch.pred is not None
                   and batch.pred in batch.positions)
        if self.scored_positions and at_pred and self._head is not None:
            # the head sees each row's scored position only: logits (n, 1, V), read at position 0
            pred = batch.pred_positions()
            handles.append(self._head.register_forward_pre_hook(_gather_rows(pred.clamp(min=0)), with_kwargs=True))
            # a row without the position stays without it (−1): the readout raises its own error, as on every token
            at = torch.where(pred >= 0, torch.zeros_like(pred), torch.full_like(pred, -1))
            scored, gathered = replace(batch, positions={**batch.positions, _SCORED: at}, pred=_SCORED), True
        many = tuple(getattr(readout, "at_positions", ()) or ())
        at_many = (bool(many) and readout is not None and not readout.at_position
                   and all(p in batch.positions for p in many))
        if self.scored_positions and at_many and self._head is not None:
            # a readout of several named positions per row (GreedyTokens): the head sees those tokens only, (n, m, d);
            # the positions become 0 … m−1 of the gathered logits (−1 stays −1)
            at = torch.stack([batch.positions[p] for p in many], 1)
            handles.append(self._head.register_forward_pre_hook(_gather_rows(at.clamp(min=0)), with_kwargs=True))
            scored = replace(batch, positions={**batch.positions, **{
                p: torch.where(at[:, j] >= 0, torch.full_like(at[:, j], j), at[:, j]) for j, p in enumerate(many)}})
            gathered = True
        # the head's rows of the tokens the readout reads, when those are all it reads (models/head.py), with the
        # streamed normaliser where it wants their log-probabilities: the forward ends where the vocabulary
        # projection would read its input
        # (at several named positions — a continuation's log-probability — the named tokens (n, m), one per position)
        head = self.head if (at_pred or (at_many and readout.normalise)) and self.head_rows else None  # type: ignore
        ids = readout.token_ids(scored) if head is not None else None  # type: ignore[union-attr]
        grab = head.capture() if head is not None and ids is not None else None
        res = None
        try:
            with torch.enable_grad() if grad else torch.inference_mode():
                try:
                    with skipped(self._blocks, *start) if start else contextlib.nullcontext():
                        res = self.model(**inputs)
                except StopForward:
                    pass
                if grab is not None:
                    got = grab.x
                    assert got is not None, "the forward did not reach the vocabulary projection"
                    if at_pred:
                        x = got[:, 0] if gathered else got[torch.arange(len(got), device=got.device),
                                                           batch.pred_positions().clamp(min=0).to(got.device)]
                        rows = head.log_probs(x, ids) if readout.normalise else head.rows(x, ids)  # type: ignore
                    else:  # the m named positions' states (n, m, d), each scored at its own token
                        if not gathered:
                            at = torch.stack([batch.positions[p] for p in many], 1).clamp(min=0).to(got.device)
                            got = got[torch.arange(len(got), device=got.device)[:, None], at]
                        n, m = ids.shape  # type: ignore[union-attr]
                        rows = head.log_probs(got.reshape(n * m, -1), ids.reshape(n * m, 1)).view(n, m)  # type: ignore
                    scores = readout.from_token_logits(rows.to(dev), scored)  # type: ignore[union-attr]
                else:
                    scores = readout.scores(res.logits, scored) if readout is not None else None
        finally:
            for h in handles:
                h.remove()
            if grab is not None:
                grab.remove()
        return RunOutput({s: acts[s] for s in read}, scores)

    def _depth(self, module: nn.Module, pre: bool) -> int:
        if pre:
            return 0
        return next((i + 1 for i, b in enumerate(self._blocks) if b is module), self.n_layers + 1)  # else: final norm

    @staticmethod
    def _register(module: nn.Module, pre: bool, patch: Callable[[Tensor], Tensor]):
        if pre:
            def pre_hook(_m, args, kwargs):
                if args:
                    return (patch(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": patch(kwargs["hidden_states"])}
            return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

        def hook(_m, _inp, output):
            if isinstance(output, tuple):
                return (patch(output[0]), *output[1:])
            if isinstance(output, Tensor):
                return patch(output)
            output[0] = patch(output[0])  # ModelOutput-like
            return output
        return module.register_forward_hook(hook)

    def map(self, items: Sequence[Any], formatter: Formatter, read: Sequence[Site] = (),
            edits: Mapping[Site, EditSpec] | None = None, readout: Readout | None = None,
            desc: str | None = None, dtype: torch.dtype = torch.float32,
            resume: CleanStates | None = None) -> RunOutput:
        """:meth:`run` over a whole item list; outputs in input order, on the CPU, read states in ``dtype``
        (float32 by default; ``torch.bfloat16`` halves the memory of a bf16 model's states).

        The list is tokenised once and cut into length-sorted batches (:meth:`stream`). Edits are
        :class:`EditSpec` over the whole list (bound per batch). Replacing the last layer's state at the prediction
        position and scoring it needs only the LM head: that case skips the model. ``resume``: the items' clean
        states (:meth:`clean_states` of ``formatter(items)``), each batch resuming at its lowest edited or read layer.
        """
        edits = dict(edits or {})
        n = len(items)
        if self._head_only(read, edits, readout, formatter):
            return self._map_head(n, edits, readout)  # type: ignore[arg-type]
        read = list(dict.fromkeys(read))
        acts: dict[Site, Tensor] = {s: torch.zeros(n, self.hidden_size, dtype=dtype) for s in read}
        scores: Tensor | None = None
        for chunk in self.stream(items, formatter, read, edits, readout, dtype=dtype, desc=desc, resume=resume):
            for s, v in chunk.acts.items():
                acts[s][chunk.rows] = v
            if chunk.scores is not None:
                scores = _put(scores, n, chunk.rows, chunk.scores)
        return RunOutput(acts, scores)

    def stream(self, items: Sequence[Any], formatter: Formatter, read: Sequence[Site] = (),
               edits: Mapping[Site, EditSpec] | None = None, readout: Readout | None = None,
               windows: Sequence[tuple[int, int]] | None = None, dtype: torch.dtype = torch.float32,
               desc: str | None = None, resume: CleanStates | None = None) -> Iterator[Chunk]:
        """The engine under :meth:`map` and cached extraction: :class:`Chunk` s of results, batch by batch.

        Items are tokenised once per window (``windows``: row ranges ``[a, b)``, default the whole list; extraction
        uses the cache's shards), sorted by token length within a window and cut into batches of at most
        ``batch_size`` rows and ``batch_tokens`` padded tokens (:func:`~cprobe.models.batching.plan_batches`).
        On a CUDA device the next batches are built on a background thread into pinned memory and copied
        without blocking, and each batch's read states (all sites at once) come back in one device→host copy
        that overlaps the next batch's forward. A CUDA out-of-memory error halves the batch and retries; the
        size that fits is remembered (:class:`~cprobe.models.batching.BatchLimits`). Chunks arrive window by
        window (a window's chunks in length order; ``Chunk.rows`` says which rows they hold).
        """
        edits = dict(edits or {})
        read = list(dict.fromkeys(read))
        windows = list(windows) if windows is not None else [(0, len(items))]
        dev = self.device
        cuda = dev.type == "cuda"
        prefetch = self.prefetch if self.prefetch is not None else cuda
        cap = self.token_cap()

        def batches() -> Iterator[tuple[int, Batch]]:
            for w, (a, b) in enumerate(windows):
                enc = formatter.encode(items[a:b], self)
                for idx in plan_batches(enc.lengths, self.batch_size, cap):
                    yield w, enc.batch(idx, rows=idx + a)

        source: Any = Prefetcher(batches(), pin=cuda) if prefetch else batches()
        total = sum(b - a for a, b in windows)
        # a bar on a terminal when asked (desc), else — always — a log line every 30 s with an ETA
        bar = Progress(f"{desc or 'forward'} ({self.name}, items)", total, bars=desc is not None)
        pending: list[tuple[Any, int, Tensor, Tensor | None, Tensor | None]] = []
        try:
            for w, batch in source:
                for piece in self._pieces(batch):
                    for done in self._run_piece(piece, w, read, edits, readout, dtype, cuda, pending, resume):
                        bar.update(len(done.rows))
                        yield done
            while pending:
                done = self._finish(pending.pop(0), read)
                bar.update(len(done.rows))
                yield done
        finally:
            bar.close()
            if isinstance(source, Prefetcher):
                source.close()

    # ----------------------------------------------------------------- the engine's internals
    def limit_key(self, mode: str = "infer") -> str:
        """What a remembered batch limit is valid for: model, dtype, max_length, device, inference or training."""
        where = "+".join(d if d == "disk" else device_label(torch.device(d)) for d in self._where.split("+")) \
            if self._where else device_label(self.device)  # a device map: every device it spans
        return f"{self.name}|{str(self.dtype).removeprefix('torch.')}|max_length={self.max_length}|{where}|{mode}"

    def token_cap(self, mode: str = "infer") -> int | None:
        """The padded-token budget of a batch: ``batch_tokens`` and any limit learnt from an out-of-memory error."""
        learnt = self.limits.get(self.limit_key(mode))
        caps = [c for c in (self.batch_tokens, learnt) if c]
        return min(caps) if caps else None

    def _pieces(self, batch: Batch) -> Iterator[Batch]:
        """``batch`` itself, or consecutive sub-batches within the current token cap (learnt after an OOM)."""
        cap = self.token_cap()
        width = batch.input_ids.shape[1]
        if cap is None or len(batch) * width <= cap or len(batch) == 1:
            yield batch
            return
        step = max(1, cap // max(width, 1))
        for s in range(0, len(batch), step):
            yield batch.select(torch.arange(s, min(s + step, len(batch))))

    def _run_piece(self, piece: Batch, w: int, read: list[Site], edits: Mapping[Site, EditSpec],
                   readout: Readout | None, dtype: torch.dtype, cuda: bool, pending: list,
                   resume: CleanStates | None = None) -> Iterator[Chunk]:
        work = [piece]
        while work:
            p = work.pop(0)
            oom = False
            try:
                res = None if resume is None else resume.take(p.rows, p.input_ids, p.attention_mask, self.name,
                                                               self.device)
                out = self.run(p.to(self.device, non_blocking=True), read,
                               {s: e.bind(p.rows) for s, e in edits.items()}, readout, resume=res)
                if cuda:  # one device->host copy of every read site, overlapping the next batch's forward
                    host = _pinned(torch.stack([out.acts[s].to(dtype) for s in read], 1)) if read else None
                    sc = _pinned(out.scores) if out.scores is not None else None
                    event = torch.cuda.Event()
                    event.record()
                    del out
                    pending.append((event, w, p.rows, host, sc))
                else:
                    chunk = Chunk(w, p.rows, {s: out.acts[s].to(dtype) for s in read},
                                  out.scores.cpu() if out.scores is not None else None)
            except Exception as e:  # noqa: BLE001 - only an out-of-memory error is handled here
                if not is_oom(e):
                    raise
                oom = True
            if oom:  # outside the except block: the traceback's tensors are freed before retrying
                half = self.backoff(len(p), int(p.input_ids.shape[1]))
                work[:0] = [p.select(torch.arange(half)), p.select(torch.arange(half, len(p)))]
                continue
            if cuda:
                while len(pending) > 1:  # the previous batch's copy has had this batch's forward to finish
                    yield self._finish(pending.pop(0), read)
            else:
                yield chunk

    @staticmethod
    def _finish(p: tuple, read: list[Site]) -> Chunk:
        event, w, rows, host, sc = p
        event.synchronize()
        return Chunk(w, rows, {s: host[:, j] for j, s in enumerate(read)} if host is not None else {}, sc)

    def backoff(self, rows: int, width: int) -> int:
        """After a device out-of-memory error on ``rows`` rows × ``width`` tokens: remember half that size for this
        model and device and return the rows of the first half to retry (a clear error when one row does not fit)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if rows == 1:
            raise ConfigError(f"one sequence of {width} tokens does not fit in the memory of {self.device} for "
                              f"{self.name}; lower model.max_length, use model.dtype=bfloat16 or a larger device")
        half = rows // 2
        self.limits.set(self.limit_key(), half * width)
        log.warning("out of memory on %s with %d rows x %d tokens; retrying in halves (this size is remembered "
                    "for %s)", self.device, rows, width, self.name)
        return half

    def _head_only(self, read: Sequence[Site], edits: Mapping[Site, EditSpec], readout: Readout | None,
                   formatter: Formatter) -> bool:
        if read or readout is None or not readout.at_position or self._head is None or len(edits) != 1:
            return False
        (site, spec), = edits.items()
        pred = getattr(formatter, "pred_position", None)
        return (isinstance(spec, Replace) and site.layer == self.n_layers and site.stream == "resid"
                and pred is not None and site.position == pred)

    @torch.inference_mode()
    def _map_head(self, n: int, edits: Mapping[Site, EditSpec], readout: Readout) -> RunOutput:
        (spec,) = edits.values()
        assert isinstance(spec, Replace) and self._head is not None
        scores: Tensor | None = None
        step = 4 * self.batch_size
        for s in range(0, n, step):
            rows = torch.arange(s, min(s + step, n))
            v = spec.vectors[rows].to(self.device, self.dtype)
            batch = Batch(torch.zeros(len(rows), 1, dtype=torch.long), torch.ones(len(rows), 1, dtype=torch.long),
                          {"head": torch.zeros(len(rows), dtype=torch.long)}, rows, pred="head")
            ids = readout.token_ids(batch) if self.head is not None and self.head_rows else None
            if ids is not None:  # the head's rows of the readout's tokens (models/head.py)
                x = self.head.input_of(self._head, v)
                part = readout.from_token_logits(self.head.log_probs(x, ids) if readout.normalise
                                                 else self.head.rows(x, ids), batch)
            else:
                logits = self._head(v)[:, None, :]  # (n, 1, V): one "token" at position 0
                part = readout.scores(self.head.post(logits) if self.head is not None else logits, batch)
            scores = _put(scores, n, rows, part.cpu())
        return RunOutput({}, scores)
