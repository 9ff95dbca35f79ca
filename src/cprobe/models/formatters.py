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
- :class:`ClassificationFormatter` (plain TextItems): positions ``cls`` (token 0) and ``last``;
- :class:`TokensFormatter` (plain TextItems): positions ``token:j``, the j-th of the text's own tokens (special and
  start tokens left out), −1 past its end — every token's state, for scores pooled over a text (AxBench);
- :class:`ContinuationFormatter` (any formatter's items with continuation token ids in ``meta``): the base
  formatter's tokens with each item's continuation appended — teacher forcing — and positions ``answer:j``, the
  token whose next-token prediction is continuation token j (RAVEL's multi-token values).

Tokens are aligned to words/regions through the fast tokenizer's character offsets: a token belongs to the
region holding its last character; special and padding tokens (empty offsets) belong to none.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from cprobe.data.base import Example
from cprobe.data.items import OBJECT_SLOT, TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.models.batching import Encoded, last_tokens, span_tensors
from cprobe.models.sites import Batch


class ModelLike(Protocol):
    """What a formatter reads of a model: its fast tokenizer, kind, name, token limit and start token.
    :class:`cprobe.models.adapter.ModelAdapter` has them; this module does not import it (the adapter imports
    formatters, never the other way: no import circle)."""

    tok: Any
    kind: str
    name: str
    max_length: int
    bos_id: int | None  # a causal LM's start token (model.bos; cprobe.models.bos), None: none


class Formatter(ABC):
    """Turns a list of items into token ids and named positions for one model: :meth:`encode` tokenises a whole
    list at once (positions found by tensor ops), :meth:`__call__` gives one padded :class:`Batch`."""

    name: str = "formatter"
    pred_position: str | None = None
    """The position whose output token readouts score (the same for every batch of this formatter)."""
    chunk: int = 4096
    """Items tokenised per tokenizer call (bounds the padded intermediate tensors)."""

    def spec(self) -> dict[str, Any]:
        """A JSON-able identity for cache keys."""
        return {"formatter": self.name}

    @abstractmethod
    def length(self, item: Any) -> int:
        """A cheap length proxy (words or characters), for callers that sort items before tokenising."""

    def encode(self, items: Sequence[Any], adapter: ModelLike) -> Encoded:
        """Tokenise ``items`` for ``adapter``'s model: ragged ids and every named position (:class:`Encoded`)."""
        parts = [self._encode(items[i: i + self.chunk], adapter) for i in range(0, len(items), self.chunk)]
        return Encoded.cat(parts) if parts else self._encode([], adapter)

    @abstractmethod
    def _encode(self, items: Sequence[Any], adapter: ModelLike) -> Encoded:
        """One chunk of :meth:`encode`."""

    def __call__(self, items: Sequence[Any], adapter: ModelLike, rows: Tensor) -> Batch:
        """Tokenize ``items`` (whose indices in the full list are ``rows``) for ``adapter``'s model, as one batch."""
        return self.encode(items, adapter).batch(torch.arange(len(items)), rows)


def _last_tokens(offsets: Tensor, mask: Tensor, spans: Sequence[Sequence[tuple[int, int]]]) -> Tensor:
    """(n, W) index of the last token of each span (spans sorted, disjoint, per row), −1 when none; vectorised."""
    starts, ends, _ = span_tensors(spans)
    return last_tokens(offsets, mask, starts, ends)


def _spans(pieces: Sequence[str], sep: int) -> list[tuple[int, int]]:
    """Character span ``[start, end)`` of each piece in the pieces joined by ``sep`` characters."""
    starts = itertools.accumulate((len(p) + sep for p in pieces[:-1]), initial=0)
    return [(a, a + len(p)) for a, p in zip(starts, pieces)]


def _tokenize(adapter: ModelLike, texts: list[str], max_length: int | None = None) -> dict[str, Tensor]:
    """Right-padded ids, mask and character offsets of ``texts``, truncated to the model's limit: a causal LM's without
    the tokenizer's special tokens, its start token first (:func:`_start`); any other model's with them."""
    limit = min(adapter.max_length, max_length) if max_length else adapter.max_length
    if not texts:
        return {"input_ids": torch.zeros(0, 0, dtype=torch.long), "attention_mask": torch.zeros(0, 0, dtype=torch.long),
                "offset_mapping": torch.zeros(0, 0, 2, dtype=torch.long)}
    causal = adapter.kind == "causal"
    # right padding per call: a tokenizer shared with another library may have been set to pad left (nnsight does)
    enc = adapter.tok(texts, return_offsets_mapping=True, padding=True, padding_side="right", truncation=True,
                      max_length=limit - (_start(adapter) is not None), return_tensors="pt",
                      add_special_tokens=not causal)
    return _start_with(adapter, dict(enc))


def _start(adapter: ModelLike) -> int | None:
    """The token a causal LM's every input starts with (``model.bos``), or None."""
    return adapter.bos_id if adapter.kind == "causal" else None


def _start_with(adapter: ModelLike, enc: dict[str, Tensor]) -> dict[str, Tensor]:
    """``enc`` (right-padded) with the start token put first in every row: a column of its id, mask 1 and the empty
    offsets of a special token (it belongs to no word or region)."""
    start = _start(adapter)
    if start is None:
        return enc
    n = enc["input_ids"].shape[0]
    return {"input_ids": torch.cat([torch.full((n, 1), start, dtype=enc["input_ids"].dtype), enc["input_ids"]], 1),
            "attention_mask": torch.cat([torch.ones((n, 1), dtype=enc["attention_mask"].dtype),
                                         enc["attention_mask"]], 1),
            "offset_mapping": torch.cat([torch.zeros((n, 1, 2), dtype=enc["offset_mapping"].dtype),
                                         enc["offset_mapping"]], 1)}


def _unpadded(tok: Any, texts: list[str], pad_id: int) -> dict[str, Tensor]:
    """Tokenise without special tokens or truncation (no pad token needed), then right-pad with tensor ops."""
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True) if texts else \
        {"input_ids": [], "offset_mapping": []}
    lengths = torch.tensor([len(x) for x in enc["input_ids"]], dtype=torch.long)
    width = int(lengths.max()) if len(texts) else 0
    mask = torch.arange(width)[None, :] < lengths[:, None]
    ids = torch.full((len(texts), width), pad_id, dtype=torch.long)
    offsets = torch.zeros((len(texts), width, 2), dtype=torch.long)
    ids[mask] = torch.tensor([t for row in enc["input_ids"] for t in row], dtype=torch.long)
    offsets[mask] = torch.tensor([o for row in enc["offset_mapping"] for o in row], dtype=torch.long).reshape(-1, 2)
    return {"input_ids": ids, "attention_mask": mask.long(), "offset_mapping": offsets}


def _pad_id(adapter: ModelLike) -> int:
    tok = adapter.tok
    return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


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

    def _encode(self, items: Sequence[Example], adapter: ModelLike) -> Encoded:
        fed = [self.words(ex, adapter) for ex in items]
        texts = [" ".join(words) for words, _ in fed]
        spans = [_spans(words, 1) for words, _ in fed]
        targets = [target for _, target in fed]
        enc = _tokenize(adapter, texts)
        n = len(items)
        last = _last_tokens(enc["offset_mapping"], enc["attention_mask"], spans)  # (n, W)
        rows = torch.arange(n)
        n_words = torch.tensor([len(s) for s in spans], dtype=torch.long)
        tgt = last[rows, torch.tensor(targets, dtype=torch.long)] if n else torch.zeros(0, dtype=torch.long)
        if bool((tgt < 0).any()):
            i = int((tgt < 0).nonzero()[0])
            raise DataError(f"example {items[i].id}: the target word was truncated (max_length={adapter.max_length})")
        pos: dict[str, Tensor] = {}
        for p in self.positions:
            if p == "target":
                pos[p] = tgt
            elif p == "first":
                pos[p] = torch.zeros(n, dtype=torch.long)
            else:
                w = int(p.split(":", 1)[1])
                bad = (w < -n_words) | (w >= n_words)
                if bool(bad.any()):
                    i = int(bad.nonzero()[0])
                    raise DataError(f"example {items[i].id}: position {p} but the model input has "
                                    f"{len(spans[i])} words")
                pos[p] = last[rows, (w % n_words.clamp(min=1))] if n else torch.zeros(0, dtype=torch.long)
        return Encoded.from_padded(enc["input_ids"], enc["attention_mask"], pos, _pad_id(adapter), self.pred_position)


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
    """Region-aligned texts (``TextItem.regions``): one position per region's last token, and the last token; a
    causal LM's start token (``model.bos``) first."""

    name = "regions"
    pred_position = "last"

    def length(self, item: TextItem) -> int:
        return len(item.text)

    def _encode(self, items: Sequence[TextItem], adapter: ModelLike) -> Encoded:
        for it in items:
            if not it.regions:
                raise DataError(f"item {it.id} has no regions; the region formatter needs region-aligned items")
        spans = [_spans(it.regions, 0) for it in items]  # contiguous regions: [start, start + len)
        texts = ["".join(it.regions) for it in items]
        # no truncation, no special tokens: the regions alone, then the start token
        enc = _start_with(adapter, _unpadded(adapter.tok, texts, _pad_id(adapter)))
        ids, mask = enc["input_ids"], enc["attention_mask"]
        starts, ends, _ = span_tensors(spans)
        # regions tile the text: a token belongs to the region holding its last character (empty regions get none)
        last = last_tokens(enc["offset_mapping"], mask, starts, torch.full_like(ends, _BIG))
        pos = {f"region:{r}": last[:, r] for r in range(last.shape[1])}
        pos["last"] = mask.sum(1) - 1
        return Encoded.from_padded(ids, mask, pos, _pad_id(adapter), self.pred_position)


_BIG = torch.iinfo(torch.int64).max // 4


class ClozeFormatter(Formatter):
    """Cloze prompts with ``[Y]``: masked at ``[Y]`` (MLM) or cut before it (causal LM, next token)."""

    name = "cloze"
    pred_position = "object"

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

    def _encode(self, items: Sequence[TextItem], adapter: ModelLike) -> Encoded:
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
        spans = []
        for i, it in enumerate(items):
            mention = it.slots.get("subject")
            at = texts[i].find(mention) if mention else -1
            spans.append([(at, at + len(mention))] if at >= 0 else [])
        subj = _last_tokens(enc["offset_mapping"], mask, spans)
        subj = subj[:, 0] if subj.shape[1] else torch.full((len(items),), -1, dtype=torch.long)
        return Encoded.from_padded(enc["input_ids"], mask, {"object": obj, "subject": subj, "last": last},
                                   _pad_id(adapter), self.pred_position)


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

    def _encode(self, items: Sequence[TextItem], adapter: ModelLike) -> Encoded:
        enc = _tokenize(adapter, [it.text for it in items], self.max_length)
        mask = enc["attention_mask"]
        pos = {"cls": torch.zeros(len(items), dtype=torch.long), "last": mask.sum(1) - 1}
        return Encoded.from_padded(enc["input_ids"], mask, pos, _pad_id(adapter), self.pred_position)


class TokensFormatter(Formatter):
    """Plain texts read at every one of their own tokens: position ``token:j`` is the j-th token that covers text
    (special and start tokens, with empty offsets, are not counted), −1 past the text's end or beyond ``n_tokens``."""

    name = "tokens"

    def __init__(self, n_tokens: int) -> None:
        if n_tokens < 1:
            raise ConfigError(f"n_tokens must be >= 1, got {n_tokens}")
        self.n_tokens = n_tokens

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name, "n_tokens": self.n_tokens}

    def length(self, item: TextItem) -> int:
        return len(item.text)

    @staticmethod
    def content(adapter: ModelLike, texts: list[str]) -> tuple[dict[str, Tensor], Tensor]:
        """(the tokenizer's batch, (n, T) which tokens cover text)."""
        enc = _tokenize(adapter, texts)
        off = enc["offset_mapping"]
        return enc, enc["attention_mask"].bool() & (off[..., 1] > off[..., 0])

    @classmethod
    def counts(cls, items: Sequence[TextItem], adapter: ModelLike) -> Tensor:
        """(n,) how many of its own tokens each text has (what ``n_tokens`` would need to read them all)."""
        return torch.cat([cls.content(adapter, [it.text for it in items[i: i + cls.chunk]])[1].sum(1)
                          for i in range(0, len(items), cls.chunk)]) if items else torch.zeros(0, dtype=torch.long)

    def _encode(self, items: Sequence[TextItem], adapter: ModelLike) -> Encoded:
        enc, real = self.content(adapter, [it.text for it in items])
        rank = real.long().cumsum(1) - 1
        pos = {}
        for j in range(self.n_tokens):
            hit = real & (rank == j)
            pos[f"token:{j}"] = torch.where(hit.any(1), hit.long().argmax(1), -1)
        return Encoded.from_padded(enc["input_ids"], enc["attention_mask"], pos, _pad_id(adapter), self.pred_position)


ANSWER = "answer:{}"
"""A :class:`ContinuationFormatter` position: the token whose next-token logits predict continuation token j."""


class ContinuationFormatter(Formatter):
    """Teacher forcing: the ``base`` formatter's tokens of each item with its continuation token ids appended
    (``item.meta[key]``, a sequence of ids — tokenised by the caller, e.g. as what follows the prompt in the prompt
    and the value tokenised together). Positions: the base formatter's (unchanged: the continuation comes after
    them), ``last`` (the new last token) and ``answer:j`` for j < ``n_answer`` (:data:`ANSWER`; the base's last token
    plus j where the item has a continuation token j, else −1), the prediction position ``answer:0``. A readout of
    several positions (:class:`cprobe.models.readouts.GreedyTokens`) reads what the model writes after the prompt in
    one forward: greedy decoding writes the continuation exactly when each ``answer:j`` predicts its token j."""

    name = "continuation"
    pred_position = "answer:0"

    def __init__(self, base: Formatter, n_answer: int, key: str = "continuation") -> None:
        if n_answer < 1:
            raise ConfigError(f"n_answer must be >= 1, got {n_answer}")
        self.base, self.n_answer, self.key = base, int(n_answer), key

    def spec(self) -> dict[str, Any]:
        return {"formatter": self.name, "base": self.base.spec(), "n_answer": self.n_answer, "key": self.key}

    def length(self, item: Any) -> int:
        return self.base.length(item) + len(item.meta.get(self.key, ()))

    def _encode(self, items: Sequence[Any], adapter: ModelLike) -> Encoded:
        enc = self.base._encode(items, adapter)
        cont = [[int(t) for t in it.meta.get(self.key, ())] for it in items]
        n = len(items)
        added = torch.tensor([len(c) for c in cont], dtype=torch.long)
        lengths = enc.lengths + added
        offsets = torch.zeros(n, dtype=torch.long)
        if n > 1:
            offsets[1:] = lengths.cumsum(0)[:-1]
        ids = torch.empty(int(lengths.sum()), dtype=torch.long)
        for i, c in enumerate(cont):  # the base's ids, then the continuation
            o, L = int(offsets[i]), int(enc.lengths[i])
            ids[o:o + L] = enc.ids[int(enc.offsets[i]):int(enc.offsets[i]) + L]
            ids[o + L:o + L + len(c)] = torch.tensor(c, dtype=torch.long)
        last = enc.lengths - 1
        pos = {k: v for k, v in enc.positions.items() if k != "last"}
        pos["last"] = lengths - 1
        for j in range(self.n_answer):
            pos[ANSWER.format(j)] = torch.where(added > j, last + j, -1)
        return Encoded(ids, offsets, lengths, pos, enc.pad_id, self.pred_position)
