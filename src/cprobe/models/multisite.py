"""Many sites per forward, the sites engine's pass: :func:`edited_pass` (a site per row, pyvene's per-example
``unit_locations``: :func:`site_batch`; or every site at once), :func:`edited_generate` (greedy decoding under the same
edits: MIB's generated outputs), :func:`rowwise_dii`, :class:`SitesForward` (DAS; :meth:`SitesForward.run`, any
edit) and :class:`EditForward` (the same with an edit of its own: DBM's gated interchange)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from cprobe.models.adapter import ModelAdapter, RunOutput
from cprobe.models.batching import is_oom, plan_batches
from cprobe.models.edits import Edit, dii
from cprobe.models.readouts import NextToken, Readout, TargetLogProb, TopK
from cprobe.models.resume import CleanStates, Resume
from cprobe.models.sites import Batch, Site
from cprobe.progress import track


def site_batch(batch: Batch, items: Tensor, row_site: Tensor, sites: Sequence[Site]) -> tuple[Batch, list[Site]]:
    """The batch whose row r is item ``items[r]`` of ``batch`` (trimmed to its longest row), edited at site
    ``sites[row_site[r]]``: one synthetic position per (layer, stream) of those sites, holding each row's site
    position where the row's site is at that layer and −1 elsewhere (an edit there leaves the row alone). Returns
    the batch and its synthetic sites, so one forward carries interventions at many sites, one per row."""
    sub = batch.select(items)
    keys = sorted({(sites[i].layer, sites[i].stream) for i in row_site.unique().tolist()})
    group = torch.tensor([keys.index((s.layer, s.stream)) if (s.layer, s.stream) in keys else -1 for s in sites],
                         dtype=torch.long)
    table = torch.stack([batch.positions[s.position] for s in sites])  # (sites, N)
    at = table[row_site, items]
    out = []
    for g, (layer, stream) in enumerate(keys):
        name = f"sites@{layer}.{stream}"
        sub.positions[name] = torch.where(group[row_site] == g, at, torch.full_like(at, -1))
        out.append(Site(layer, name, stream))  # type: ignore[arg-type]
    sub.rows = torch.arange(len(items))
    return sub, out


def edited_pass(adapter: ModelAdapter, batch: Batch, items: Tensor, sites: Sequence[Site],
                edits: Callable[[Tensor, Batch, list[Site]], Mapping[Site, Edit]],
                score: Callable[[Tensor, RunOutput], None], *, row_site: Tensor | None = None,
                read: Sequence[Site] = (), readout: Callable[[Tensor], Readout | None] | None = None,
                clean: CleanStates | None = None, order: Tensor | None = None, desc: str | None = None,
                progress: bool = False) -> None:
    """The one edited pass over rows of (item, {site: edit}): row r is item ``items[r]`` of ``batch``, edited at
    ``sites[row_site[r]]`` (one site per row: :func:`site_batch`) or, with no ``row_site``, at every site at once.
    Chunks of ``model.batch_size`` rows in ``order`` (else the length-sorted batches of :func:`plan_batches`, with the
    token cap; a device out-of-memory error halves a chunk and retries, the size remembered) resume from ``clean`` at their lowest edited layer (:mod:`cprobe.models.resume`), read the ``read``
    sites at or above it and score ``readout(items)``; ``edits(rows, chunk, its sites)`` gives a chunk's edits and
    ``score(rows, output)`` is the study's metric (TransformerLens' ``patching_metric`` habit: ``models/`` never
    imports ``metrics/``)."""
    chunks = (plan_batches(batch.attention_mask[items].sum(1), adapter.batch_size, adapter.token_cap())
              if order is None else list(order.split(adapter.batch_size)))
    dev = adapter.device
    for chunk in track(chunks, desc or "edited pass", progress):
        work = [chunk]
        while work:  # a device out-of-memory error halves the chunk and retries (adapter.backoff)
            rows = work.pop(0)
            if row_site is None:
                sub, at = batch.select(items[rows]), list(sites)
            else:
                sub, at = site_batch(batch, items[rows], row_site[rows], sites)
            low = min((s.layer for s in at), default=0)
            try:
                res = None if clean is None else clean.take(items[rows], sub.input_ids, sub.attention_mask,
                                                            adapter.name, dev, [low])
                out = adapter.run(sub.to(dev), read=[s for s in read if s.layer >= low], edits=edits(rows, sub, at),
                                  readout=None if readout is None else readout(items[rows]), resume=res)
            except Exception as e:  # noqa: BLE001 - only an out-of-memory error is handled here
                if not is_oom(e):
                    raise
                out = None
            if out is None:  # outside the except block: the traceback's tensors are freed before retrying
                half = adapter.backoff(len(rows), int(sub.input_ids.shape[1]))
                work[:0] = [rows[:half], rows[half:]]
                continue
            score(rows, out)


def extend(batch: Batch, tokens: Tensor) -> Batch:
    """``batch`` (right-padded) with ``tokens`` (n, s) appended to each row's own tokens, its prediction position the
    new last token (position ``next``); every other position, ``last`` too, still names its prompt token."""
    n, s = tokens.shape
    lengths = batch.attention_mask.sum(1).cpu()
    width = int(lengths.max()) + s if n else s
    ids = torch.zeros((n, width), dtype=batch.input_ids.dtype)
    mask = torch.zeros((n, width), dtype=batch.attention_mask.dtype)
    keep = min(width, batch.input_ids.shape[1])
    ids[:, :keep], mask[:, :keep] = batch.input_ids[:, :keep].cpu(), batch.attention_mask[:, :keep].cpu()
    rows = torch.arange(n)
    for j in range(s):
        ids[rows, lengths + j] = tokens[:, j].to(ids.dtype)
        mask[rows, lengths + j] = 1
    positions = {**{k: v.cpu() for k, v in batch.positions.items()}, "next": lengths + s - 1}
    return Batch(ids, mask, positions, batch.rows, "next")


def edited_generate(adapter: ModelAdapter, batch: Batch, items: Tensor, sites: Sequence[Site],
                    edits: Callable[[Tensor, Batch, list[Site]], Mapping[Site, Edit]], steps: int, *,
                    row_site: Tensor | None = None, clean: CleanStates | None = None, desc: str | None = None,
                    progress: bool = False) -> Tensor:
    """Greedy decoding of ``steps`` tokens for rows of (item, {site: edit}) as :func:`edited_pass` runs them: token j
    of row r is the argmax after item ``items[r]`` and the row's tokens before j, with the row's edits at their prompt
    sites in every step (the first step resumed from ``clean``). Returns the token ids (n_rows, steps)."""
    n = len(items)
    out = torch.zeros((n, steps), dtype=torch.long)
    prompts = batch.select(items)
    prompts.rows = torch.arange(n)
    for j in range(steps):
        def score(rows: Tensor, res: RunOutput, j: int = j) -> None:
            out[rows, j] = res.scores[:, 0].cpu()
        first = j == 0
        edited_pass(adapter, batch if first else extend(prompts, out[:, :j]), items if first else torch.arange(n),
                    sites, edits, score, row_site=row_site, readout=lambda _: TopK(1), clean=clean if first else None,
                    desc=desc, progress=progress)
    return out


def rowwise_dii(source: Tensor, direction: Tensor, whole: Tensor | None = None) -> Callable[[Tensor], Tensor]:
    """An edit applying, row-wise, the DII toward ``source[r]`` along ``direction[r]`` (both (n, d)) — with bases
    ``direction`` (n, d, k) of orthonormal columns, the k-dimensional interchange ``h + R Rᵀ (s − h)`` (DAS's k) —,
    or the whole-vector swap where ``whole[r]``; computed in float32 and cast back, differentiable in ``direction``."""
    def edit(h: Tensor) -> Tensor:
        hf = h.float()
        new = dii(hf, source, direction) if direction.dim() == 2 else \
            hf + (((source - hf)[:, None] @ direction) @ direction.mT)[:, 0]
        if whole is not None:
            new = torch.where(whole[:, None], source, new)
        return new.to(h.dtype)
    return edit


class SitesForward:
    """The DAS forward for K sites that share their train rows (:data:`cprobe.directions.das.BatchForward`): every
    step's rows, K times, edited copy k at site k, in one pass. The step batches are built and moved to the device
    before training, so a step reads nothing back from the device. Given the train items' ``clean`` states, every
    step resumes at the lowest site's layer (:mod:`cprobe.models.resume`): the blocks below it never run; where every
    site is at the rows' last token and ``clean`` holds the prefix's key/value cache, that token alone runs above it."""

    def __init__(self, adapter: ModelAdapter, train: Batch, rows: Tensor, sites: Sequence[Site],
                 windows: Sequence[tuple[int, int]], clean: CleanStates | None = None,
                 readout: Callable[[slice], Readout] | None = None) -> None:
        self.adapter, self.K = adapter, len(sites)
        self.readout = readout  # a step's readout of its window of rows (default: the next token's log-distribution)
        self.batches: dict[tuple[int, int], tuple[Batch, list[Site]]] = {}
        # a window's clean states (b, T, d), the step's rows of them, the prefix's key/value cache (clean kv=True)
        self.resume: dict[tuple[int, int], tuple[Tensor, Tensor, dict]] = {}
        low = min(s.layer for s in sites)  # every step resumes at the lowest site's layer (clean: the train items')
        for start, stop in windows:
            b = stop - start
            items = rows[start:stop].repeat(self.K)
            row_site = torch.arange(self.K).repeat_interleave(b)
            batch, at = site_batch(train, items, row_site, sites)
            self.batches[start, stop] = (batch.to(adapter.device), at)
            if clean is not None and low in clean.states:
                own = train.select(rows[start:stop])
                res = clean.take(rows[start:stop], own.input_ids, own.attention_mask, adapter.name, adapter.device,
                                 [low])
                st = res.states[low]
                self.resume[start, stop] = (st, torch.arange(b, device=st.device).repeat(self.K), dict(res.kv))
        self.low = low

    @staticmethod
    def dii(rows: slice, h_source: Tensor, a: Tensor) -> Edit:
        """The step's edit: the DII toward ``h_source`` (K, b, d) along ``a``, the K directions (K, d) or, DAS's
        k > 1, the K orthonormal bases (K, d, k), row-wise over the K·b rows."""
        K, b, d = h_source.shape
        return rowwise_dii(h_source.reshape(K * b, d), a.repeat_interleave(b, 0))

    def __call__(self, rows: slice, h_source: Tensor, a: Tensor) -> Tensor:
        """Next-token scores (K, b, V) of the step's rows under :meth:`dii`."""
        return self.run(rows, self.dii(rows, h_source, a))

    def log_prob(self, rows: slice, h_source: Tensor, a: Tensor, target: Tensor) -> Tensor:
        """log p(target) (K, b) of the step's rows under :meth:`dii` (:meth:`run_log_prob`)."""
        return self.run_log_prob(rows, self.dii(rows, h_source, a), target)

    def run(self, rows: slice, edit: Edit) -> Tensor:
        """The step's rows, K times, with ``edit`` over the K·b rows (site-major: copy k edited at site k) at every
        site: next-token scores (K, b, V)."""
        readout = NextToken() if self.readout is None else self.readout(rows)
        return self._run(rows, edit, readout).view(self.K, rows.stop - rows.start, -1)

    def run_log_prob(self, rows: slice, edit: Edit, target: Tensor) -> Tensor:
        """log p(target) (K, b) over the whole vocabulary of the step's rows under ``edit``, copy k toward its own
        ``target[k]`` (K, b): DAS's loss, from the head's target rows and its streamed normaliser
        (:class:`~cprobe.models.readouts.TargetLogProb`), never the (K·b, V) logits. With a readout of its own (a
        multi-token label's), the log-softmax of its scores at ``target``."""
        if self.readout is not None:
            return torch.log_softmax(self.run(rows, edit).float(), -1).gather(2, target[..., None])[..., 0]
        out = self._run(rows, edit, TargetLogProb(target.reshape(-1)))
        return out.view(self.K, rows.stop - rows.start)

    def _run(self, rows: slice, edit: Edit, readout: Readout) -> Tensor:
        batch, at = self.batches[rows.start, rows.stop]
        st = self.resume.get((rows.start, rows.stop))
        res = None if st is None else Resume(self.adapter.name, {self.low: st[0][st[1]]},
                                             {l: (k[st[1]], v[st[1]]) for l, (k, v) in st[2].items()})
        out = self.adapter.run(batch, edits={s: edit for s in at}, readout=readout, grad=True, resume=res).scores
        assert out is not None
        return out


class EditForward:
    """A training forward (:data:`cprobe.directions.das.BatchForward`) over a :class:`SitesForward` with an edit of
    its own: ``make(rows, h_source, params)`` builds the step's edit of the K·b rows from the trained parameters
    (DBM's gated interchange over each site's basis); scores and log p(target) as :class:`SitesForward` gives them."""

    def __init__(self, sites: SitesForward, make: Callable[[slice, Tensor, Tensor], Edit]) -> None:
        self.sites, self.make = sites, make

    def __call__(self, rows: slice, h_source: Tensor, params: Tensor) -> Tensor:
        return self.sites.run(rows, self.make(rows, h_source, params))

    def log_prob(self, rows: slice, h_source: Tensor, params: Tensor, target: Tensor) -> Tensor:
        return self.sites.run_log_prob(rows, self.make(rows, h_source, params), target)
