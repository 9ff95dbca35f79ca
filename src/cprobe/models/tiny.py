"""The project's own tiny BERT (MLM) and GPT-NeoX (causal) models, trained on the agreement grammar
(:func:`ensure_tiny_model`) or on any sentence corpus, e.g. a fact world's (:func:`ensure_corpus_model`).

The demo must run fully offline, so the models are trained here the first time they are asked
for and cached under a key that hashes everything that determines them. The saved directory is
an ordinary Hugging Face checkpoint (``config.json``, ``model.safetensors``, tokenizer files), so
the rest of cprobe loads it exactly like a downloaded model.

Tokenizers are word-level: every grammar word is one token, so the verb slot is one position and
"P(correct) vs P(wrong)" compares two token ids.

Training always uses :data:`TRAIN_THREADS` (1) intra-op threads, whatever the job's own thread count. Corpus models
train in the portable process (:func:`train_portable`, :mod:`cprobe.models.portable`: ATen and MKL pinned to their AVX2
code paths), so the same key
gives bitwise the same weights on every x86-64 CPU with AVX2; agreement-grammar models still train in the job's
process (their studies' documented numbers come from those weights).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from cprobe.cache import checked_entry, kind_dir
from cprobe.compute import thread_budget, threads
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from torch import Tensor
from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, BertConfig,
                          BertForMaskedLM, GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedModel, PreTrainedTokenizerBase,
                          PreTrainedTokenizerFast)

from cprobe.data.base import NONE, Example
from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.errors import ConfigError, DataError, ModelLoadError
from cprobe.io import read_json
from cprobe.models.portable import TRAIN_THREADS, numerics_mode, run_portable
from cprobe.models.sites import pad
from cprobe.progress import track

log = logging.getLogger(__name__)

Kind = Literal["bert", "neox"]
# Bump when training code changes what a cached model contains; it is part of the cache key.
VERSION = 1
_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json")
_CHECKED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")  # in checksums.json
_BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_NEOX_SPECIAL = ("<|endoftext|>", "<|padding|>", "<|unk|>")
_HELDOUT_SEED_OFFSET = 1_000_003  # held-out sentences come from a different grammar seed


@dataclass(frozen=True)
class TinyTrainConfig:
    """Architecture and optimisation of a tiny model (part of the cache key)."""

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 64
    dropout: float = 0.0
    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.05  # fraction of steps
    mask_prob: float = 0.15  # BERT: standard random masking rate
    verb_mask_prob: float = 0.75  # BERT: share of sentences with only the verb masked
    agreement_weight: float = 1.0  # BERT: weight of the logistic correct-vs-wrong loss at a masked verb
    answer_weight: float = 0.0  # GPT-NeoX: weight of an extra cross-entropy on each sentence's last word (an answer)
    eval_sentences: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "intermediate", "max_positions", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tiny.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ConfigError(f"tiny.hidden ({self.hidden}) must be divisible by tiny.heads ({self.heads})")
        for name in ("dropout", "warmup", "mask_prob", "verb_mask_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"tiny.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0 or self.eval_sentences < 1 or self.agreement_weight < 0 or self.answer_weight < 0:
            raise ConfigError("tiny.lr must be > 0, tiny.eval_sentences >= 1 and tiny.agreement_weight, "
                              "tiny.answer_weight >= 0")


def _train_key(train: TinyTrainConfig) -> dict:
    """The training settings as they enter a cache key (a setting at the default it had before it existed is left out,
    so models trained before it keep their key)."""
    t = asdict(train)
    if not t["answer_weight"]:
        del t["answer_weight"]
    return t


def model_key(kind: Kind, grammar: GrammarConfig, train: TinyTrainConfig, extra_sentences: Sequence[str] = ()) -> str:
    """Hash of everything that determines the trained model."""
    g = asdict(grammar)
    if not g["attractor_agreement"]:
        del g["attractor_agreement"]  # models trained before the option existed keep their key
    spec = {"kind": kind, "grammar": g, "train": _train_key(train), "extra": list(extra_sentences), "version": VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def ensure_tiny_model(kind: Kind, grammar: GrammarConfig, train: TinyTrainConfig, cache_dir: Path,
                      extra_sentences: Sequence[str] = (), progress: bool = True) -> Path:
    """Directory of the tiny ``kind`` model for these configs, training and caching it on first use.

    Safe under concurrency (a file lock makes one job train while others wait) and under crashes
    (training writes a temp dir that is renamed into place; an incomplete dir is rebuilt).
    """
    _check_kind(kind)
    key = model_key(kind, grammar, train, extra_sentences)
    return cached_build(Path(cache_dir), f"tiny-{kind}-{key}", key,
                        lambda tmp: _build(kind, grammar, train, list(extra_sentences), key, tmp, progress))


def _check_kind(kind: str) -> None:
    if kind not in ("bert", "neox"):
        raise ConfigError(f"unknown tiny model kind {kind!r}; choose 'bert' or 'neox'")


def cached_build(cache_dir: Path, name: str, key: str, build: Callable[[Path], None]) -> Path:
    """``cache_dir/name`` for ``key``, built by ``build(tmp_dir)`` on first use: a checked entry
    (:func:`cprobe.cache.checked_entry`: locked, atomic, checksummed — the weights, configs and tokenizer files;
    an incomplete or corrupted dir is rebuilt). ``build`` must write ``training.json`` with ``key``."""
    return checked_entry(Path(cache_dir) / name, build, f"the tiny model {name}", checked=_CHECKED,
                         valid=lambda path: _key_problem(path, key))[0]


def ensure_corpus_model(kind: Kind, words: Sequence[str], corpus: Callable[[], tuple[list[str], list[int]]],
                        spec: dict, train: TinyTrainConfig, cache_dir: Path, init_from: Path | None = None,
                        progress: bool = True) -> Path:
    """Directory of a tiny ``kind`` LM trained on a sentence corpus (cached under a key of ``spec`` — everything that
    determines the corpus —, ``train``, the starting model and the numerics mode), training it on first use in a
    portable process (:func:`train_portable`: the same weights on every x86-64 CPU with AVX2).

    ``corpus()`` returns the sentences (space-separated words from ``words``) and, per sentence, the word index of
    a slot that a masked LM sees masked alone in a share ``train.verb_mask_prob`` of its updates (−1: none) — for
    fact corpora, the object, so tiny MLMs learn facts in minutes. ``init_from`` continues training a cached model
    (same tokenizer) instead of starting from scratch.
    """
    _check_kind(kind)
    train = replace(train, agreement_weight=0.0)
    init_key = training_report(init_from)["key"] if init_from is not None else None
    key = hashlib.sha256(json.dumps({"kind": kind, "spec": spec, "train": _train_key(train), "init": init_key,
                                     "version": VERSION, "numerics": numerics_mode()},
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]

    def build(out: Path) -> None:
        if not progress:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        sentences, slots = corpus()
        tokenizer = (build_tokenizer(kind, sorted(set(words)), train.max_positions) if init_from is None
                     else AutoTokenizer.from_pretrained(init_from))
        unknown = sorted(_words(sentences) - set(tokenizer.get_vocab()))
        if unknown:
            raise DataError(f"corpus words outside the model's vocabulary: {unknown[:5]}")
        ids = tokenizer(sentences)["input_ids"]
        if kind == "neox":
            ids = [[*seq, tokenizer.eos_token_id] for seq in ids]
        longest = max(len(seq) for seq in ids)
        if longest > train.max_positions:
            raise ConfigError(f"a corpus sentence has {longest} tokens > train.max_positions={train.max_positions}")
        pos = [p + 1 if p >= 0 else -1 for p in slots]  # words are single tokens after [CLS] / BOS
        none = [-1] * len(ids)
        tokenizer.save_pretrained(out)
        numerics = train_portable(kind, out, ids, pos, (none, none), train, out, init_from, progress)
        report = {"kind": kind, "key": key, "version": VERSION, "train_seconds": numerics.pop("train_seconds"),
                  "n_train_sentences": len(sentences), "vocab_size": len(tokenizer), "spec": spec,
                  "train": asdict(train), "init": init_key, "numerics": numerics}
        (out / "training.json").write_text(json.dumps(report, indent=2, default=str))

    return cached_build(Path(cache_dir), f"corpus-{kind}-{key}", key, build)


def train_portable(kind: Kind, tokenizer_dir: Path, ids: list[list[int]], verb_pos: list[int],
                   forms: tuple[list[int], list[int]], train: TinyTrainConfig, out: Path,
                   init_from: Path | None = None, progress: bool = True) -> dict:
    """Train a tiny model (from scratch, or on from ``init_from``) in the portable training process and save it to
    ``out``; returns the run's numerics (CPU capability used, thread count, library versions) and
    ``train_seconds``."""
    job = {"kind": kind, "tokenizer": str(tokenizer_dir), "ids": ids, "pos": verb_pos, "forms": list(forms),
           "train": asdict(train), "init_from": str(init_from) if init_from else None, "out": str(out),
           "progress": progress, "cores": thread_budget()}
    return run_portable("cprobe.models.tiny:_train_job", job, f"training a tiny {kind} model")


def _train_job(job: dict) -> dict:
    """One training run in the portable process (:func:`train_portable`)."""
    import transformers

    if not job["progress"]:
        transformers.utils.logging.disable_progress_bar()
    kind, train = job["kind"], TinyTrainConfig(**job["train"])
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    torch.manual_seed(train.seed)
    if job["init_from"] is None:
        model = _init_model(kind, tokenizer, train)
    else:
        auto = AutoModelForMaskedLM if kind == "bert" else AutoModelForCausalLM
        model = auto.from_pretrained(job["init_from"])
    start = time.perf_counter()
    _train(model, tokenizer, kind, job["ids"], job["pos"], tuple(job["forms"]), train, job["progress"],
           job.get("cores", 1))
    seconds = time.perf_counter() - start
    model.eval()
    model.save_pretrained(job["out"])
    return {"train_seconds": round(seconds, 2), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "mkl_cbwr": os.environ.get("MKL_CBWR"), "torch": torch.__version__,
            "transformers": transformers.__version__}


# --- tokenizers -------------------------------------------------------------------------------


def _words(sentences: Sequence[str]) -> set[str]:
    pre = pre_tokenizers.Whitespace()
    return {piece for s in sentences for piece, _ in pre.pre_tokenize_str(s)}


def build_tokenizer(kind: Kind, words: Sequence[str], max_length: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` in the BERT or GPT-NeoX convention."""
    special = _BERT_SPECIAL if kind == "bert" else _NEOX_SPECIAL
    vocab = {tok: i for i, tok in enumerate([*special, *sorted(set(words) - set(special))])}
    unk = "[UNK]" if kind == "bert" else "<|unk|>"
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
            mask_token="[MASK]", model_max_length=max_length,
            model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    # BOS is prepended so the first word is predicted from context, as in GPT-style LMs.
    eos = "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(single=f"{eos} $A", pair=f"{eos} $A {eos} $B",
                                                       special_tokens=[(eos, vocab[eos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=unk,
                                   pad_token="<|padding|>", model_max_length=max_length,
                                   model_input_names=["input_ids", "attention_mask"])


# --- training ---------------------------------------------------------------------------------


def _build(kind: Kind, grammar: GrammarConfig, train: TinyTrainConfig, extra: list[str], key: str, out: Path,
           progress: bool) -> None:
    data = generate(grammar)
    seen = {e.words for e in data.examples}
    heldout_cfg = replace(grammar, seed=grammar.seed + _HELDOUT_SEED_OFFSET, n_sentences=train.eval_sentences)
    heldout = [e for e in generate(heldout_cfg).examples if e.words not in seen]

    grammar_words = vocabulary(grammar)
    split = [w for w in grammar_words if _words([w]) != {w}]
    if split:
        raise ValueError(f"grammar words are not single pre-tokens: {split}")
    tokenizer = build_tokenizer(kind, sorted(set(grammar_words) | _words(extra)), train.max_positions)

    sentences = [" ".join(e.words) for e in data.examples] + extra
    ids = tokenizer(sentences)["input_ids"]
    if kind == "neox":
        ids = [[*seq, tokenizer.eos_token_id] for seq in ids]
    too_long = max(len(seq) for seq in ids)
    if too_long > train.max_positions:
        raise ConfigError(f"a training sentence has {too_long} tokens > tiny.max_positions={train.max_positions}; "
                          "raise it")
    # The verb slot's token position: words are single tokens and [CLS]/BOS comes first.
    verb_pos = [e.target + 1 for e in data.examples] + [-1] * len(extra)
    pad = [-1] * len(extra)
    forms = (tokenizer.convert_tokens_to_ids([e.correct for e in data.examples]) + pad,
             tokenizer.convert_tokens_to_ids([e.wrong for e in data.examples]) + pad)

    torch.manual_seed(train.seed)
    model = _init_model(kind, tokenizer, train)
    # TRAIN_THREADS (1): tiny matrices, and a fixed reduction order. (Trained in this process, so the CPU's own
    # instruction set applies: agreement models keep the weights their studies' documented numbers come from;
    # train_portable would pin them like the fact-world models.)
    with threads(TRAIN_THREADS):
        start = time.perf_counter()
        _train(model, tokenizer, kind, ids, verb_pos, forms, train, progress, thread_budget())
        seconds = time.perf_counter() - start

    model.eval()
    prefs = _preferences(model, tokenizer, heldout)
    attractor = torch.tensor([e.props["z_e"] != NONE for e in heldout])
    mismatch = torch.tensor([e.props["z_e"] not in (NONE, e.props["z_c"]) for e in heldout])
    report = {"kind": kind, "key": key, "version": VERSION, "train_seconds": round(seconds, 2),
              "heldout_examples": len(heldout), "heldout_accuracy": float(prefs.float().mean()),
              "heldout_attractor_accuracy": float(prefs[attractor].float().mean()),
              "heldout_mismatch_accuracy": float(prefs[mismatch].float().mean()),
              "n_train_sentences": len(sentences), "vocab_size": len(tokenizer), "grammar": asdict(grammar),
              "train": asdict(train)}
    log.info("tiny %s trained in %.1fs: held-out agreement %.3f (attractors %.3f, mismatched attractors %.3f)", kind,
             seconds, report["heldout_accuracy"], report["heldout_attractor_accuracy"],
             report["heldout_mismatch_accuracy"])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(report, indent=2))


def _init_model(kind: Kind, tokenizer: PreTrainedTokenizerFast, train: TinyTrainConfig) -> PreTrainedModel:
    common = dict(vocab_size=len(tokenizer), hidden_size=train.hidden, num_hidden_layers=train.layers,
                  num_attention_heads=train.heads, intermediate_size=train.intermediate,
                  max_position_embeddings=train.max_positions, pad_token_id=tokenizer.pad_token_id)
    if kind == "bert":
        # Tied input/output embeddings keep tiny BERT on a long plateau where it ignores the
        # subject's number (52% agreement after 1500 steps); untied it learns in ~100 steps.
        return BertForMaskedLM(BertConfig(**common, hidden_dropout_prob=train.dropout,
                                          attention_probs_dropout_prob=train.dropout, tie_word_embeddings=False))
    return GPTNeoXForCausalLM(GPTNeoXConfig(**common, hidden_dropout=train.dropout, attention_dropout=train.dropout,
                                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))


def _train(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, kind: Kind, ids: list[list[int]],
           verb_pos: list[int], forms: tuple[list[int], list[int]], train: TinyTrainConfig, progress: bool,
           cores: int = 1) -> None:
    """AdamW with warm-up + cosine decay; BERT adds a pairwise agreement loss at masked verbs. On one intra-op thread;
    with ``cores`` ≥ 2 (the job's thread budget) the backward's weight gradients take a second core, bit for bit.

    The MLM loss alone leaves tiny BERT at chance on agreement for some seeds (a long plateau);
    the logistic loss on logit(correct) - logit(wrong) makes escaping it reliable.
    """
    from cprobe.models.twocore import two_core_backward

    correct_ids, wrong_ids = torch.tensor(forms[0]), torch.tensor(forms[1])
    positions_all = torch.tensor(verb_pos)
    gen = torch.Generator().manual_seed(train.seed)
    # foreach: the same update as the per-tensor loop, bit for bit, in one call per step (13% of a tiny BERT's step)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay, foreach=True)
    warm = max(1, int(train.warmup * train.steps))

    def schedule(step: int) -> float:  # linear warm-up, cosine decay to zero
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, train.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    order = torch.randperm(len(ids), generator=gen)
    cursor = 0
    model.train()
    with two_core_backward(model, enabled=cores >= 2):  # the same bits, a second core (models/twocore.py)
        for _ in track(range(train.steps), f"training tiny {kind}", progress):
            if cursor + train.batch_size > len(order):
                order, cursor = torch.randperm(len(ids), generator=gen), 0
            batch = order[cursor : cursor + train.batch_size].tolist()
            cursor += train.batch_size
            input_ids, attention = pad([ids[i] for i in batch], tokenizer.pad_token_id)
            if kind == "neox":
                labels = input_ids.masked_fill(attention == 0, -100)
                out = model(input_ids=input_ids, attention_mask=attention, labels=labels)
                loss = out.loss
                if train.answer_weight > 0:  # the last word before the end token: [start] … word <end>
                    at, rows = attention.sum(1) - 3, torch.arange(len(input_ids))
                    loss = loss + train.answer_weight * torch.nn.functional.cross_entropy(
                        out.logits[rows, at], input_ids[rows, at + 1])
            else:
                positions = positions_all[batch]
                input_ids, labels, verb_only = _mask(input_ids, attention, positions, tokenizer, train, gen)
                out = model(input_ids=input_ids, attention_mask=attention, labels=labels)
                loss = out.loss
                rows = verb_only.nonzero(as_tuple=True)[0]
                if train.agreement_weight > 0 and len(rows):
                    at = out.logits[rows, positions[rows]]
                    idx = [batch[i] for i in rows.tolist()]
                    margin = at.gather(1, correct_ids[idx, None]) - at.gather(1, wrong_ids[idx, None])
                    loss = loss + train.agreement_weight * torch.nn.functional.softplus(-margin).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)


def _mask(input_ids: Tensor, attention: Tensor, verb_pos: Tensor, tokenizer: PreTrainedTokenizerFast,
          train: TinyTrainConfig, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Per sentence: only the verb slot masked (``verb_mask_prob``), else standard 80/10/10 masking.

    Keeping the two apart matters: random masks on top of the verb mask hide the subject often
    enough that tiny BERT stays at chance on agreement for 500+ steps.
    """
    special = torch.isin(input_ids, torch.tensor(tokenizer.all_special_ids)) | (attention == 0)
    rows = torch.arange(len(input_ids))
    verb_only = (verb_pos >= 0) & (torch.rand(len(input_ids), generator=gen) < train.verb_mask_prob)
    verb = torch.zeros_like(special)
    verb[rows[verb_only], verb_pos[verb_only]] = True
    chosen = (torch.rand(input_ids.shape, generator=gen) < train.mask_prob) & ~special & ~verb_only[:, None]
    labels = input_ids.masked_fill(~(chosen | verb), -100)
    masked = input_ids.clone()
    roll = torch.rand(input_ids.shape, generator=gen)
    masked[(chosen & (roll < 0.8)) | verb] = tokenizer.mask_token_id
    random_tok = chosen & (roll >= 0.8) & (roll < 0.9) & ~verb
    masked[random_tok] = torch.randint(len(tokenizer), (int(random_tok.sum()),), generator=gen)
    return masked, labels, verb_only


# --- evaluation -------------------------------------------------------------------------------


def _preferences(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example],
                 batch_size: int = 256) -> Tensor:
    """Bool per example: logit(correct) > logit(wrong) at the verb slot (mask or next token)."""
    masked = model.config.model_type == "bert"
    out = []
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            if masked:  # the verb slot masked
                texts = [" ".join((*e.words[: e.target], tokenizer.mask_token, *e.words[e.target + 1 :]))
                         for e in chunk]
            else:  # the prefix, whose next token is the verb
                texts = [" ".join(e.prefix) for e in chunk]
            enc = tokenizer(texts, padding=True, padding_side="right", return_tensors="pt")
            logits = model(**enc).logits
            if masked:
                rows, pos = (enc["input_ids"] == tokenizer.mask_token_id).nonzero(as_tuple=True)
            else:
                rows, pos = torch.arange(len(chunk)), enc["attention_mask"].sum(1) - 1
            at = logits[rows, pos]
            good = torch.tensor([_token_id(tokenizer, e.correct) for e in chunk])
            bad = torch.tensor([_token_id(tokenizer, e.wrong) for e in chunk])
            idx = torch.arange(len(chunk))
            out.append(at[idx, good] > at[idx, bad])
    return torch.cat(out)


def _token_id(tokenizer: PreTrainedTokenizerBase, word: str) -> int:
    tid = tokenizer.convert_tokens_to_ids(word)
    if tid is None or tid == tokenizer.unk_token_id:
        raise DataError(f"verb {word!r} is not in the tiny model's vocabulary; add it via extra_sentences")
    return tid


def training_report(path: Path) -> dict:
    """The ``training.json`` of a trained tiny model (held-out accuracies, cost, configs)."""
    return json.loads((Path(path) / "training.json").read_text())


def _key_problem(path: Path, key: str) -> str | None:
    """What keeps a checksum-verified ``path`` from being the model for ``key``: a missing file, another key."""
    missing = [f for f in _FILES if not (path / f).is_file()]
    if missing:
        return f"{', '.join(missing)} missing"
    report = read_json(path / "training.json")
    if report is None:
        return "training.json unreadable"
    return "trained for another configuration" if report.get("key") != key else None


def tiny_model_dir(name: str, tiny: dict, cache_root: Path, progress: bool = True, data_root: Path | None = None) -> Path:
    """The trained model directory for a ``model.tiny`` config node (trained and cached on first use), checked
    against its ``gate`` (minimum held-out agreement accuracy)."""
    from cprobe.data.registry import CORPORA, grammar_config, with_corpora
    from cprobe.paths import data_dir

    t = with_corpora(tiny, data_root or data_dir())  # sentences of the corpora it names join its corpus
    gate = t.pop("gate", 0.9)
    unknown = sorted(set(t) - {"kind", "grammar", "train", "extra_sentences"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under model.tiny; known: "
                          f"{sorted(['extra_sentences', 'gate', 'grammar', 'kind', 'train', *CORPORA.names()])}")
    try:
        train = TinyTrainConfig(**(t.get("train") or {}))
    except TypeError as e:
        raise ConfigError(f"bad model.tiny.train config: {e}") from None
    out = ensure_tiny_model(t.get("kind", "bert"), grammar_config(t.get("grammar")), train, kind_dir(cache_root, "models"),
                            extra_sentences=tuple(t.get("extra_sentences", ())), progress=progress)
    acc = float(training_report(out)["heldout_accuracy"])
    if acc < float(gate):
        raise ModelLoadError(f"tiny model {name!r} reached held-out agreement accuracy {acc:.3f}, below its gate "
                             f"{float(gate):.2f} (model.tiny.gate); train longer (model.tiny.train.steps) or lower "
                             "the gate")
    return out
