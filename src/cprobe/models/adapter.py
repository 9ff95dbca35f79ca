"""One interface over masked and causal LMs: tokenize with word alignment, read and write hidden states.

Layer convention (as HF ``output_hidden_states``): layer 0 is the embedding output, layer l ≥ 1 the
output of block l, and the last layer is whatever HF reports last (for causal LMs with a final norm,
that is the normed state the LM head reads). *Writing* at layer l replaces exactly that tensor at the
given positions and lets the rest of the model run, so read → write round-trips are exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from cprobe.data.base import Example
from cprobe.errors import ConfigError, DataError
from cprobe.models.edits import EditSpec, Replace
from cprobe.models.readouts import Readout
from cprobe.models.sites import Batch, Site

if TYPE_CHECKING:  # pragma: no cover
    from cprobe.models.formatters import Formatter

log = logging.getLogger(__name__)

Kind = Literal["mlm", "causal", "encoder", "classifier"]
Edit = Callable[[Tensor], Tensor]

# Where the blocks and the final norm live, by ``config.model_type``; others are found generically.
_BLOCKS = {
    "bert": "encoder.layer",
    "roberta": "encoder.layer",
    "distilbert": "transformer.layer",
    "gpt_neox": "layers",
    "gpt2": "h",
    "llama": "layers",
    "mistral": "layers",
    "qwen2": "layers",
    "gemma": "layers",
}
_FINAL_NORMS = ("final_layer_norm", "ln_f", "norm")


@dataclass
class RunOutput:
    """What one pass returns: the hidden states read at each site (n, d) and the readout's scores (n, k)."""

    acts: dict[Site, Tensor]
    scores: Tensor | None


class _Stop(Exception):
    """Raised by the deepest read hook when nothing after it is needed (no readout): ends the forward early."""


@dataclass
class Encoded:
    """A tokenized batch: right-padded ids, the read/write site and the prediction position per row."""

    input_ids: Tensor  # (n, T)
    attention_mask: Tensor  # (n, T)
    site: Tensor  # (n,) token index read/written
    pred: Tensor  # (n,) token index whose output predicts the target word


def model_positions(config) -> int | None:
    """How many token positions the model can take (None when its config does not say)."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n and config.model_type in ("roberta", "xlm-roberta", "camembert"):
        n -= 2  # position ids start after the padding index
    return int(n) if n else None


def _get(obj: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class ModelAdapter:
    """Wraps an HF model + fast tokenizer. Build with :func:`cprobe.models.load.load_adapter`."""

    def __init__(self, model: nn.Module, tokenizer, kind: Kind, name: str, batch_size: int = 32,
                 layers_path: str | None = None, max_length: int = 256) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tok = tokenizer
        self.kind = kind
        self.name = name
        self.batch_size = batch_size
        self.max_length = min(max_length, model_positions(model.config) or max_length)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token or self.tok.unk_token
        self.tok.padding_side = "right"
        cfg = model.config
        self.n_layers: int = cfg.num_hidden_layers
        self.hidden_size: int = cfg.hidden_size
        self._base = getattr(model, "base_model", model)
        self._blocks = self._find_blocks(layers_path)
        self._final_norm = self._find_final_norm()
        self._head = self._find_head()

    # ----------------------------------------------------------------- structure
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _find_blocks(self, layers_path: str | None) -> nn.ModuleList:
        path = layers_path or _BLOCKS.get(self.model.config.model_type)
        if path is not None:
            try:
                blocks = _get(self._base, path)
            except AttributeError:
                raise ConfigError(f"model {self.name!r} has no module {path!r}; set model.layers_path") from None
        else:
            lists = [m for m in self._base.modules() if isinstance(m, nn.ModuleList) and len(m) == self.n_layers]
            if not lists:
                raise ConfigError(
                    f"cannot find the transformer blocks of model type {self.model.config.model_type!r}; "
                    f"supported: {sorted(_BLOCKS)}; or set model.layers_path (e.g. 'encoder.layer')"
                )
            blocks = lists[0]
        if len(blocks) != self.n_layers:
            raise ConfigError(f"{self.name}: found {len(blocks)} blocks but config says {self.n_layers}")
        return blocks

    def _find_final_norm(self) -> nn.Module | None:
        if self.kind == "mlm" or self.model.config.model_type in ("bert", "roberta", "distilbert"):
            return None
        for n in _FINAL_NORMS:
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
            raise ConfigError(
                f"layer(s) {bad} out of range for {self.name}: valid layers are 0 (embeddings) … {self.n_layers}"
            )
        return sorted(set(layers))

    # ----------------------------------------------------------------- tokenization
    def candidate_id(self, word: str) -> int | None:
        """Token id of ``word`` as the next/masked word, or None when it is not a single token."""
        ids = self.tok.encode(" " + word, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def _text(self, ex: Example) -> tuple[list[str], int]:
        """Words fed to the model and the index of the word whose last token is the site."""
        if self.kind == "causal":
            if ex.target == 0:
                raise DataError(f"example {ex.id}: a causal LM needs at least one word before the target")
            return list(ex.prefix), ex.target - 1
        words = list(ex.words)
        if self.tok.mask_token is None:
            raise ConfigError(f"model {self.name!r} has no mask token; use a causal LM or an MLM")
        words[ex.target] = self.tok.mask_token
        return words, ex.target

    def encode(self, examples: Sequence[Example], position: str = "target") -> Encoded:
        """Tokenize ``examples``; ``position`` is 'target' (mask / last prefix token), 'first',
        or 'word:i' (last token of word i of the model input)."""
        texts, sites, preds = [], [], []
        word_spans: list[list[tuple[int, int]]] = []
        for ex in examples:
            words, target_word = self._text(ex)
            spans, pos = [], 0
            for w in words:
                spans.append((pos, pos + len(w)))
                pos += len(w) + 1
            texts.append(" ".join(words))
            word_spans.append(spans)
            preds.append(target_word)
            if position == "target":
                sites.append(target_word)
            elif position == "first":
                sites.append(-1)
            elif position.startswith("word:"):
                i = int(position.split(":", 1)[1])
                if not -len(words) <= i < len(words):
                    raise DataError(f"example {ex.id}: position {position} but the input has {len(words)} words")
                sites.append(i % len(words))
            else:
                raise ConfigError(f"unknown position rule {position!r}; choose from ['first', 'target', 'word:<i>']")
        enc = self.tok(texts, return_offsets_mapping=True, padding=True, truncation=True,
                       max_length=self.max_length, return_tensors="pt")
        offsets = enc["offset_mapping"]
        site_tok = torch.empty(len(texts), dtype=torch.long)
        pred_tok = torch.empty(len(texts), dtype=torch.long)
        for i in range(len(texts)):
            last_tok = self._last_tokens(offsets[i], enc["attention_mask"][i], word_spans[i])
            p = last_tok.get(preds[i])
            if p is None:
                raise DataError(f"example {examples[i].id}: target word was truncated (max_length={self.max_length})")
            pred_tok[i] = p
            site_tok[i] = 0 if sites[i] == -1 else last_tok[sites[i]]
        return Encoded(enc["input_ids"], enc["attention_mask"], site_tok, pred_tok)

    @staticmethod
    def _last_tokens(offsets: Tensor, mask: Tensor, spans: list[tuple[int, int]]) -> dict[int, int]:
        """Map word index -> index of its last token, via character offsets."""
        out: dict[int, int] = {}
        w = 0
        for t in range(len(offsets)):
            s, e = offsets[t].tolist()
            if not mask[t] or e <= s:
                continue  # padding or special token
            while w < len(spans) and s >= spans[w][1]:
                w += 1
            if w < len(spans) and s < spans[w][1] and e > spans[w][0]:
                out[w] = t
        return out

    def batches(self, examples: Sequence[Example], position: str = "target", desc: str | None = None,
                ) -> Iterator[tuple[Tensor, Encoded]]:
        """Length-sorted batches: yields (original indices, Encoded)."""
        lengths = [len(e.words) for e in examples]
        order = sorted(range(len(examples)), key=lambda i: lengths[i], reverse=True)
        chunks = [order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for chunk in tqdm(chunks, desc=desc, disable=desc is None or None, leave=False):
            yield torch.tensor(chunk), self.encode([examples[i] for i in chunk], position)

    # ----------------------------------------------------------------- read
    def _forward(self, enc: Encoded, **kw):
        return self.model(input_ids=enc.input_ids.to(self.device),
                          attention_mask=enc.attention_mask.to(self.device), **kw)

    @torch.inference_mode()
    def read(self, examples: Sequence[Example], layers: Sequence[int], position: str = "target",
             candidates: Sequence[tuple[int, int]] | None = None, desc: str | None = "extract",
             ) -> tuple[dict[int, Tensor], Tensor | None]:
        """Hidden states (float32, CPU) at ``layers`` and the site of each example, in input order.

        With ``candidates`` ((correct_id, wrong_id) per example) also returns their logits at the
        prediction position, shape (n, 2) — the model's own task score from the same forward pass.
        """
        layers = self.check_layers(layers)
        n = len(examples)
        out = {l: torch.empty(n, self.hidden_size) for l in layers}
        cand_logits = torch.empty(n, 2) if candidates is not None and self.kind != "encoder" else None
        for idx, enc in self.batches(examples, position, desc):
            res = self._forward(enc, output_hidden_states=True)
            rows = torch.arange(len(idx), device=self.device)
            site = enc.site.to(self.device)
            for l in layers:
                out[l][idx] = res.hidden_states[l][rows, site].float().cpu()
            if cand_logits is not None:
                logits = res.logits[rows, enc.pred.to(self.device)].float()
                cid = torch.tensor([candidates[i] for i in idx.tolist()], device=self.device)
                cand_logits[idx] = logits.gather(1, cid).cpu()
        return out, cand_logits

    # ----------------------------------------------------------------- write
    def _hook_target(self, layer: int) -> tuple[nn.Module, bool]:
        """(module, is_pre_hook) whose output (or input, for a pre-hook) is hidden_states[layer]."""
        if layer == 0:
            return self._blocks[0], True
        if layer == self.n_layers and self._final_norm is not None:
            return self._final_norm, False
        return self._blocks[layer - 1], False

    def _install(self, layer: int, site: Tensor, edit: Edit):
        module, pre = self._hook_target(layer)

        def patch(h: Tensor) -> Tensor:
            rows = torch.arange(h.shape[0], device=h.device)
            new = edit(h[rows, site]).to(h.dtype)
            return h.index_put((rows, site), new)

        return self._register(module, pre, patch)

    def forward_with_edit(self, enc: Encoded, layer: int, edit: Edit, site: Tensor | None = None) -> Tensor:
        """Log-probs (n, V) at the prediction positions after replacing hidden_states[layer][row, site]
        by ``edit(original rows)``. Differentiable w.r.t. whatever ``edit`` closes over (no
        inference_mode here); wrap in ``torch.inference_mode()`` when no gradient is needed."""
        if self.kind == "encoder":
            raise ConfigError(f"model {self.name!r} has no LM head; interventions cannot be scored on it")
        self.check_layers([layer])
        site = (enc.site if site is None else site).to(self.device)
        handle = self._install(layer, site, edit)
        try:
            res = self._forward(enc)
        finally:
            handle.remove()
        rows = torch.arange(enc.input_ids.shape[0], device=self.device)
        return res.logits[rows, enc.pred.to(self.device)].float().log_softmax(-1)

    @torch.inference_mode()
    def write(self, examples: Sequence[Example], layer: int, vectors: Tensor, candidates: Sequence[tuple[int, int]],
              position: str = "target", desc: str | None = None) -> Tensor:
        """Candidate log-probs (n, 2) after setting hidden_states[layer] at each example's site to ``vectors``."""
        out = torch.empty(len(examples), 2)
        if layer == self.n_layers and self._head is not None and position == "target":
            # Nothing runs after the last layer but the LM head: apply it directly (no re-encoding).
            cid = torch.tensor(list(candidates), device=self.device)
            for s in range(0, len(examples), 4 * self.batch_size):
                v = vectors[s: s + 4 * self.batch_size].to(self.device, self.dtype)
                lp = self._head(v).float().log_softmax(-1)
                out[s: s + len(v)] = lp.gather(1, cid[s: s + len(v)]).cpu()
            return out
        for idx, enc in self.batches(examples, position, desc):
            v = vectors[idx].to(self.device, self.dtype)
            lp = self.forward_with_edit(enc, layer, lambda _h, v=v: v)
            cid = torch.tensor([candidates[i] for i in idx.tolist()], device=self.device)
            out[idx] = lp.gather(1, cid).cpu()
        return out

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
            readout: Readout | None = None, grad: bool = False) -> RunOutput:
        """One forward pass over ``batch``: apply every edit at its site, read every ``read`` site (after the
        edits at that site), and score the output with ``readout``.

        ``edits`` are bound to this batch (see :meth:`EditSpec.bind`): each receives the (n, d) site vectors
        of all rows and returns their new values; rows whose position is absent (−1) are left unchanged and
        read as zeros. With ``grad`` the pass is differentiable in whatever the edits close over (DAS);
        otherwise it runs under ``torch.inference_mode``. Tensors come back on the model's device.
        """
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
        order = [k for k in points]
        depth = {k: self._depth(points[k][0], points[k][1]) for k in order}
        last_read = max((k for k in order if points[k][3]), key=depth.__getitem__, default=None)
        stop_early = readout is None and not grad and last_read is not None and all(
            depth[k] <= depth[last_read] for k in order)

        def make(key):
            _module, _pre, edit_sites, read_sites = points[key]

            def patch(h: Tensor) -> Tensor:
                n = h.shape[0]
                rows = torch.arange(n, device=h.device)
                for s in edit_sites:
                    pos = batch.position(s.position)
                    ok = pos >= 0
                    new = edits[s](h[rows, pos.clamp(min=0)])
                    h = h.index_put((rows[ok], pos[ok]), new[ok].to(h.dtype))
                for s in read_sites:
                    pos = batch.position(s.position)
                    v = h[rows, pos.clamp(min=0)]
                    acts[s] = torch.where((pos >= 0)[:, None], v, torch.zeros_like(v))
                if stop_early and key == last_read:
                    raise _Stop
                return h
            return patch

        handles = [self._register(points[k][0], points[k][1], make(k)) for k in order]
        res = None
        try:
            with torch.enable_grad() if grad else torch.inference_mode():
                try:
                    res = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **batch.extra)
                except _Stop:
                    pass
                scores = readout.scores(res.logits, batch) if readout is not None else None
        finally:
            for h in handles:
                h.remove()
        return RunOutput({s: acts[s] for s in read}, scores)

    def _depth(self, module: nn.Module, pre: bool) -> int:
        if pre:
            return 0
        for i, b in enumerate(self._blocks):
            if b is module:
                return i + 1
        return self.n_layers + 1  # the final norm

    @staticmethod
    def _register(module: nn.Module, pre: bool, patch: Callable[[Tensor], Tensor]):
        if pre:
            def pre_hook(_m, args, kwargs):
                if args:
                    return (patch(args[0]), *args[1:]), kwargs
                kwargs = dict(kwargs)
                kwargs["hidden_states"] = patch(kwargs["hidden_states"])
                return args, kwargs
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
            desc: str | None = None) -> RunOutput:
        """:meth:`run` over a whole item list in length-sorted batches; outputs in input order, float32 on CPU.

        Edits are :class:`EditSpec` over the whole list (bound per batch). Replacing the last layer's state at
        the prediction position and scoring it needs only the LM head: that case skips the model.
        """
        edits = dict(edits or {})
        n = len(items)
        if self._head_only(read, edits, readout, formatter):
            return self._map_head(n, edits, readout)  # type: ignore[arg-type]
        order = sorted(range(n), key=lambda i: formatter.length(items[i]), reverse=True)
        chunks = [order[i: i + self.batch_size] for i in range(0, n, self.batch_size)]
        acts: dict[Site, Tensor] = {s: torch.zeros(n, self.hidden_size) for s in read}
        scores: Tensor | None = None
        for chunk in tqdm(chunks, desc=desc, disable=desc is None or None, leave=False):
            rows = torch.tensor(chunk, dtype=torch.long)
            batch = formatter([items[i] for i in chunk], self, rows)
            out = self.run(batch, read, {s: e.bind(rows) for s, e in edits.items()}, readout)
            for s, v in out.acts.items():
                acts[s][rows] = v.float().cpu()
            if out.scores is not None:
                if scores is None:
                    scores = torch.zeros((n, *out.scores.shape[1:]), dtype=out.scores.dtype)
                scores[rows] = out.scores.cpu()
        return RunOutput(acts, scores)

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
            logits = self._head(v)[:, None, :]  # (n, 1, V): one "token" at position 0
            batch = Batch(torch.zeros(len(rows), 1, dtype=torch.long), torch.ones(len(rows), 1, dtype=torch.long),
                          {"head": torch.zeros(len(rows), dtype=torch.long)}, rows, pred="head")
            out = readout.scores(logits, batch).cpu()
            if scores is None:
                scores = torch.zeros((n, *out.shape[1:]), dtype=out.dtype)
            scores[rows] = out
        return RunOutput({}, scores)
