"""Formatters: items -> tokenized :class:`~cprobe.models.sites.Batch` with named positions, one per item family.

Tokenization and site alignment live here, not in the model adapter, so a new item family is a new
formatter and nothing else changes:

- :class:`AgreementFormatter` (agreement :class:`~cprobe.data.base.Example`): a masked LM sees the sentence
  with the target word masked, a causal LM the prefix before it; positions ``target`` (the mask / the last
  prefix token, where the verb is predicted), ``first`` (token 0) and ``word:i`` (last token of input word i);
- :class:`RegionFormatter` (region-aligned :class:`~cprobe.data.items.TextItem`, e.g. CausalGym sentences):
  positions ``region:r`` (last token of region r, −1 when the region is empty) and ``last``;
- :class:`ClozeFormatter` (cloze TextItems with ``[Y]``): a masked LM sees the mask at ``[Y]``, a causal LM the
  prompt up to ``[Y]``; positions ``object`` (where the object is predicted), ``subject`` and ``last``;
- :class:`ClassificationFormatter` (plain TextItems): positions ``cls`` (token 0) and ``last``.

Tokens are aligned to words/regions through the fast tokenizer's character offsets: a token belongs to the
region holding its last character; special and padding tokens (empty offsets) belong to none.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from cprobe.data.base import Example
from cprobe.data.items import OBJECT_SLOT, TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.models.sites import Batch, pad


class ModelLike(Protocol):
    """What a formatter reads of a model: its fast tokenizer, kind, name and token limit.
    :class:`cprobe.models.adapter.ModelAdapter` has them; this module does not import it (the adapter imports
    formatters, never the other way: no import circle)."""

    tok: Any
    kind: str
    name: str
    max_length: int


class Formatter(ABC):
    """Turns a list of items into a :class:`Batch` for one model."""

    name: str = "formatter"
    pred_position: str | None = None
    """The position whose output token readouts score (the same for every batch of this formatter)."""

    def spec(self) -> dict[str, Any]:
        """A JSON-able identity for cache keys."""
        return {"formatter": self.name}

    @abstractmethod
    def length(self, item: Any) -> int:
        """A cheap length proxy used to sort items into batches of similar length."""

    @abstractmethod
    def __call__(self, items: Sequence[Any], adapter: ModelLike, rows: Tensor) -> Batch:
        """Tokenize ``items`` (whose indices in the full list are ``rows``) for ``adapter``'s model."""


def _last_tokens(offsets: Tensor, mask: Tensor, spans: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Map span index -> index of its last token, via character offsets (spans sorted, disjoint)."""
    starts = [s for s, _ in spans]
    out: dict[int, int] = {}
    for t in range(len(offsets)):
        s, e = offsets[t].tolist()
        if not mask[t] or e <= s:
            continue  # padding or special token
        i = bisect.bisect_right(starts, e - 1) - 1
        if i >= 0 and s < spans[i][1]:
            out[i] = t
    return out


def _tokenize(adapter: ModelLike, texts: list[str], max_length: int | None = None) -> dict[str, Tensor]:
    limit = min(adapter.max_length, max_length) if max_length else adapter.max_length
    return adapter.tok(texts, return_offsets_mapping=True, padding=True, truncation=True, max_length=limit,
                       return_tensors="pt")


class AgreementFormatter(Formatter):
    """Word-aligned agreement items: the verb slot masked (MLM) or cut off (causal LM)."""

    name = "agreement"
    pred_position = "target"

    def __init__(self, positions: Sequence[str] = ("target",)) -> None:
        self.positions = tuple(dict.fromkeys(["target", *positions]))
        for p in self.positions:
            check_word_position(p)

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name, "positions": list(self.positions)}

    def length(self, item: Example) -> int:
        return len(item.words)

    @staticmethod
    def words(ex: Example, adapter: ModelLike) -> tuple[list[str], int]:
        """Words fed to the model and the index of the word whose last token predicts the target."""
        if adapter.kind == "causal":
            if ex.target == 0:
                raise DataError(f"example {ex.id}: a causal LM needs at least one word before the target")
            return list(ex.prefix), ex.target - 1
        if adapter.tok.mask_token is None:
            raise ConfigError(f"model {adapter.name!r} has no mask token; use a causal LM or an MLM")
        words = list(ex.words)
        words[ex.target] = adapter.tok.mask_token
        return words, ex.target

    def __call__(self, items: Sequence[Example], adapter: ModelLike, rows: Tensor) -> Batch:
        texts, spans, targets = [], [], []
        for ex in items:
            words, target = self.words(ex, adapter)
            sp, at = [], 0
            for w in words:
                sp.append((at, at + len(w)))
                at += len(w) + 1
            texts.append(" ".join(words))
            spans.append(sp)
            targets.append(target)
        enc = _tokenize(adapter, texts)
        n = len(items)
        pos = {p: torch.empty(n, dtype=torch.long) for p in self.positions}
        for i in range(n):
            last = _last_tokens(enc["offset_mapping"][i], enc["attention_mask"][i], spans[i])
            if targets[i] not in last:
                raise DataError(f"example {items[i].id}: the target word was truncated "
                                f"(max_length={adapter.max_length})")
            for p in self.positions:
                if p == "target":
                    pos[p][i] = last[targets[i]]
                elif p == "first":
                    pos[p][i] = 0
                else:
                    w = int(p.split(":", 1)[1])
                    if not -len(spans[i]) <= w < len(spans[i]):
                        raise DataError(f"example {items[i].id}: position {p} but the model input has "
                                        f"{len(spans[i])} words")
                    pos[p][i] = last.get(w % len(spans[i]), -1)
        return Batch(enc["input_ids"], enc["attention_mask"], pos, rows, pred=self.pred_position)


def check_word_position(rule: str) -> str:
    """``target``, ``first`` or ``word:<i>`` (i counts input words from 0; negative counts from the end)."""
    if rule in ("target", "first"):
        return rule
    if rule.startswith("word:"):
        try:
            int(rule.split(":", 1)[1])
            return rule
        except ValueError:
            pass
    raise ConfigError(f"unknown position rule {rule!r}; choose from ['first', 'target', 'word:<i>']")


class RegionFormatter(Formatter):
    """Region-aligned texts (``TextItem.regions``): one position per region's last token, and the last token."""

    name = "regions"
    pred_position = "last"

    def __init__(self, prepend_bos: bool = False) -> None:
        self.prepend_bos = prepend_bos

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name, "prepend_bos": self.prepend_bos}

    def length(self, item: TextItem) -> int:
        return len(item.text)

    def __call__(self, items: Sequence[TextItem], adapter: ModelLike, rows: Tensor) -> Batch:
        tok = adapter.tok
        bos: list[int] = []
        if self.prepend_bos:
            if tok.bos_token_id is None:
                raise ConfigError(f"model {adapter.name!r} has no BOS token; set prepend_bos=false")
            bos = [tok.bos_token_id]
        n_regions = max(len(it.regions) for it in items)
        ids_rows, region_pos = [], torch.full((len(items), n_regions), -1, dtype=torch.long)
        for i, it in enumerate(items):
            if not it.regions:
                raise DataError(f"item {it.id} has no regions; the region formatter needs region-aligned items")
            ids, last = encode_regions(tok, it.regions, bos)
            ids_rows.append(ids)
            region_pos[i, : len(last)] = torch.tensor(last, dtype=torch.long)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        input_ids, mask = pad(ids_rows, pad_id)
        pos = {f"region:{r}": region_pos[:, r] for r in range(n_regions)}
        pos["last"] = mask.sum(1) - 1
        return Batch(input_ids, mask, pos, rows, pred=self.pred_position)


def encode_regions(tokenizer: Any, regions: Sequence[str], bos: list[int]) -> tuple[list[int], list[int]]:
    """Token ids of the joined regions (after ``bos``) and, per region, the index of its last token (or −1)."""
    starts, at = [], 0
    for region in regions:
        starts.append(at)
        at += len(region)
    enc = tokenizer("".join(regions), add_special_tokens=False, return_offsets_mapping=True)
    last = [-1] * len(regions)
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s:
            last[bisect.bisect_right(starts, e - 1) - 1] = t + len(bos)
    return bos + list(enc["input_ids"]), last


class ClozeFormatter(Formatter):
    """Cloze prompts with ``[Y]``: masked at ``[Y]`` (MLM) or cut before it (causal LM, next token)."""

    name = "cloze"
    pred_position = "object"

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name}

    def length(self, item: TextItem) -> int:
        return len(item.text)

    @staticmethod
    def text(item: TextItem, adapter: ModelLike) -> str:
        if item.text.count(OBJECT_SLOT) != 1:
            raise DataError(f"cloze item {item.id}: the text must contain {OBJECT_SLOT} exactly once")
        if adapter.kind == "causal":
            return item.text[: item.text.index(OBJECT_SLOT)].rstrip()
        if adapter.tok.mask_token is None:
            raise ConfigError(f"model {adapter.name!r} has no mask token; cloze probing needs an MLM or a causal LM")
        return item.text.replace(OBJECT_SLOT, adapter.tok.mask_token)

    def __call__(self, items: Sequence[TextItem], adapter: ModelLike, rows: Tensor) -> Batch:
        texts = [self.text(it, adapter) for it in items]
        enc = _tokenize(adapter, texts)
        mask = enc["attention_mask"]
        last = mask.sum(1) - 1
        if adapter.kind == "causal":
            obj = last.clone()
        else:
            is_mask = enc["input_ids"] == adapter.tok.mask_token_id
            if bool((is_mask.sum(1) != 1).any()):
                bad = items[int((is_mask.sum(1) != 1).nonzero()[0])].id
                raise DataError(f"cloze item {bad}: the mask was truncated or split (max_length={adapter.max_length})")
            obj = is_mask.long().argmax(1)
        subj = torch.full((len(items),), -1, dtype=torch.long)
        for i, it in enumerate(items):
            mention = it.slots.get("subject")
            at = texts[i].find(mention) if mention else -1
            if at >= 0:
                subj[i] = _last_tokens(enc["offset_mapping"][i], mask[i], [(at, at + len(mention))]).get(0, -1)
        return Batch(enc["input_ids"], mask, {"object": obj, "subject": subj, "last": last}, rows,
                     pred=self.pred_position)


class ClassificationFormatter(Formatter):
    """Plain texts for a sequence classifier (or an LM read at its last token): positions ``cls`` and ``last``."""

    name = "classification"
    pred_position = "last"

    def __init__(self, max_length: int | None = None) -> None:
        if max_length is not None and max_length < 2:
            raise ConfigError(f"max_length must be >= 2, got {max_length}")
        self.max_length = max_length

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name, "max_length": self.max_length}

    def length(self, item: TextItem) -> int:
        return len(item.text)

    def __call__(self, items: Sequence[TextItem], adapter: ModelLike, rows: Tensor) -> Batch:
        enc = _tokenize(adapter, [it.text for it in items], self.max_length)
        mask = enc["attention_mask"]
        pos = {"cls": torch.zeros(len(items), dtype=torch.long), "last": mask.sum(1) - 1}
        return Batch(enc["input_ids"], mask, pos, rows, pred=self.pred_position)
