"""Many sites per forward: a different edit site per row (pyvene's per-example ``unit_locations``, the site kept as
data): :func:`site_batch` builds the batch, :func:`rowwise_dii` the row-wise edit, :class:`SitesForward` DAS's
training forward over K sites at once. CausalGym scores many (site, edit) pairs per forward with them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import dii
from cprobe.models.readouts import NextToken
from cprobe.models.resume import CleanStates, Resume
from cprobe.models.sites import Batch, Site


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


def rowwise_dii(source: Tensor, direction: Tensor, whole: Tensor | None = None) -> Callable[[Tensor], Tensor]:
    """An edit applying, row-wise, the DII toward ``source[r]`` along ``direction[r]`` (both (n, d)), or the whole-
    vector swap where ``whole[r]``; computed in float32 and cast back, differentiable in ``direction``."""
    def edit(h: Tensor) -> Tensor:
        new = dii(h.float(), source, direction)
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
                 windows: Sequence[tuple[int, int]], clean: CleanStates | None = None) -> None:
        self.adapter, self.K = adapter, len(sites)
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

    def __call__(self, rows: slice, h_source: Tensor, a: Tensor) -> Tensor:
        K, b, d = h_source.shape
        batch, at = self.batches[rows.start, rows.stop]
        edit = rowwise_dii(h_source.reshape(K * b, d), a.repeat_interleave(b, 0))
        st = self.resume.get((rows.start, rows.stop))
        res = None if st is None else Resume(self.adapter.name, {self.low: st[0][st[1]]},
                                             {l: (k[st[1]], v[st[1]]) for l, (k, v) in st[2].items()})
        out = self.adapter.run(batch, edits={s: edit for s in at}, readout=NextToken(), grad=True, resume=res).scores
        return out.view(K, b, -1)
