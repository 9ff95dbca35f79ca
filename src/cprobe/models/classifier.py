"""Fine-tuned sequence classifiers on any encoder the project can load: the explained models of the
concept-effect studies (CEBaB, LIBERTy) and their aspect (concept) classifiers.

:class:`SequenceClassifier` = a pretrained encoder φ + the RoBERTa-style non-linear head the CEBaB paper
puts on every model (dense → tanh → dropout → out). φ(x) is what the head reads, chosen by the model family
(:mod:`cprobe.models.family`): BERT's pooler over [CLS] (dense + tanh: what ``BertForSequenceClassification`` and
the CEBaB reference's explainers read), the first token for other encoders (RoBERTa, DistilBERT), the last real token
for decoders (GPT-2, Llama, ...); ``finetune.pool`` overrides it. The state φ is computed from is a
:class:`~cprobe.models.sites.Site` — ``Site(L, "cls")`` or ``Site(L, "last")`` of
:class:`~cprobe.models.formatters.ClassificationFormatter` (:func:`phi_site`, :func:`phi_of`) — so explainers read
it through the one model entry point, and ``head`` maps φ to logits.

A head may hold several classification tasks at once (``n_tasks`` × ``n_classes`` logits; the aspect
classifier predicts the four aspects' labels jointly); targets of −100 are ignored.

:func:`finetuned_classifier` trains one (AdamW, linear decay; the paper's lr 2e-5, batch 32, max_len 128),
with a progress bar (``precision: bf16`` trains under bf16 autocast: 1.4–2× faster on CPUs with native bf16,
``scripts/bench_finetune.py``; on CPUs without it, fp32 via :func:`cprobe.compute.use_bf16`), and caches the weights as a checksummed safetensors file keyed by the base model's
weights, the training data, every hyperparameter and the seed. Training checkpoints after every epoch
(weights and optimizer moments, safetensors), so an interrupted run resumes from the last finished epoch.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
from torch import Tensor, nn

from cprobe.data.items import TextItem, fingerprint
from cprobe.compute import follow_load, use_bf16
from cprobe.errors import ConfigError
from cprobe.io import atomic_save_tensors, load_tensors, read_metadata
from cprobe.paths import safe_name
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.sites import Site

log = logging.getLogger(__name__)

Pool = Literal["first", "last", "pooler"]
POOL_POSITION = {"first": "cls", "last": "last", "pooler": "cls"}
"""Where φ is read: the first token, the last real token, or the base model's pooler over the first token."""
IGNORE = -100


class ClassificationHead(nn.Module):
    """RoBERTa's classification head: dense (d → d), tanh, dropout, out_proj (d → n_out)."""

    def __init__(self, d: int, n_out: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dense = nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d, n_out)

    def forward(self, phi: Tensor) -> Tensor:
        return self.out_proj(self.dropout(torch.tanh(self.dense(self.dropout(phi)))))


class SequenceClassifier(nn.Module):
    """Encoder + head reading φ(x); ``forward`` returns an object with ``.logits`` (n, n_out).

    φ(x) is the last hidden state at the first token (``pool: first``), at the last real token (``last``), or the
    base model's pooler over the first token (``pooler``: BERT's dense + tanh, what ``BertForSequenceClassification``
    and the CEBaB reference's explainers read).
    """

    def __init__(self, encoder: nn.Module, n_out: int, pool: Pool = "first", dropout: float = 0.1) -> None:
        super().__init__()
        if pool not in POOL_POSITION:
            raise ConfigError(f"unknown pooling {pool!r}; choose from {sorted(POOL_POSITION)}")
        if pool == "pooler" and not isinstance(getattr(encoder, "pooler", None), nn.Module):
            raise ConfigError(f"finetune.pool=pooler, but the {encoder.config.model_type} encoder has no pooler; set "
                              "finetune.pool=first")
        self.base_model = encoder
        self.head = ClassificationHead(encoder.config.hidden_size, n_out, dropout)
        self.config = encoder.config
        self.pool = pool

    def features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """φ(x) (n, d): the pooled state (module doc)."""
        h = self.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pool == "last":
            last = attention_mask.sum(1) - 1
            return h[torch.arange(len(h), device=h.device), last]
        return self.phi(h[:, 0])

    def phi(self, state: Tensor) -> Tensor:
        """φ from the state read at :func:`phi_site` (n, d): the pooler's output where the classifier reads it, else
        the state itself."""
        return self.base_model.pooler(state[:, None, :]) if self.pool == "pooler" else state

    def forward(self, input_ids: Tensor, attention_mask: Tensor, **_: Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(self.features(input_ids, attention_mask)))


@dataclass(frozen=True)
class FinetuneConfig:
    """How a classifier is fine-tuned (the CEBaB paper's max_len 128, batch 32, lr 2e-5)."""

    epochs: int = 5
    lr: float = 2e-5
    batch_size: int = 32
    max_length: int = 128
    weight_decay: float = 0.0
    warmup: float = 0.0  # share of steps with a linear warm-up
    dropout: float = 0.1
    pool: Pool | None = None  # None: the model family's (models/family.py): pooler for BERT, first token for other
    #                            encoders, last token for decoders
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: mixed precision (autocast; weights and Adam stay fp32)

    def __post_init__(self) -> None:
        bad = [k for k in ("lr", "weight_decay", "warmup", "dropout") if not math.isfinite(getattr(self, k))]
        if bad:
            raise ValueError(f"{bad[0]} must be a finite number, got {getattr(self, bad[0])}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.epochs < 1 or self.batch_size < 1 or self.max_length < 2:
            raise ValueError(f"epochs and batch_size must be >= 1 and max_length >= 2, got {self.epochs}, "
                             f"{self.batch_size}, {self.max_length}")
        if not 0 <= self.warmup < 1 or not 0 <= self.dropout < 1:
            raise ValueError(f"warmup and dropout must lie in [0, 1), got {self.warmup}, {self.dropout}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.precision!r}")


def finetune_config(d: dict | None, where: str, model_defaults: dict | None = None) -> FinetuneConfig:
    """A study's settings (null = unset) over the model config's ``finetune:`` defaults over the paper's."""
    from cprobe.config import parse

    merged = {**(model_defaults or {}), **{k: v for k, v in (d or {}).items() if v is not None}}
    return parse(FinetuneConfig, merged, where)


def default_pool(encoder: ModelAdapter) -> Pool:
    """The model family's φ (models/family.py): its pooler where its sequence classifier reads one (BERT), else
    the first token (encoders) or the last real token (decoders)."""
    from cprobe.models.family import family_of, pool_of

    return "pooler" if family_of(encoder.model.config).pooler else pool_of(encoder.model.config)


def wrap(encoder: ModelAdapter, n_out: int, pool: Pool | None = None, dropout: float = 0.1,
         name: str | None = None) -> ModelAdapter:
    """A fresh (untrained-head) classifier on a *copy* of ``encoder``'s model, as a ``classifier`` adapter."""
    from cprobe.models.placement import dispatched, require_resident

    pool = pool or default_pool(encoder)
    require_resident(encoder.model, "fine-tuning a classifier")  # offloaded weights cannot be trained
    model = SequenceClassifier(copy.deepcopy(encoder.model), n_out, pool, dropout)
    if dispatched(encoder.model):  # the copy keeps the encoder's device map; its outputs arrive on the main device
        model.head.to(encoder.device)
    else:
        model.to(encoder.device)
    return ModelAdapter(model, encoder.tok, "classifier", name or f"{encoder.name}+head", batch_size=encoder.batch_size,
                        max_length=encoder.max_length)


def phi_site(adapter: ModelAdapter) -> Site:
    """The site φ(x) is read from in a :func:`wrap`-ped classifier: φ itself, or — with ``pool: pooler`` — the
    first token's state the pooler maps to φ (:func:`phi_of`)."""
    return Site(adapter.n_layers, POOL_POSITION[adapter.model.pool], "resid")


def train_key(encoder_fp: str, items: Sequence[TextItem], targets: Tensor, n_out: int, cfg: FinetuneConfig,
              seed: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([encoder_fp, fingerprint(items), n_out, asdict(cfg), seed], sort_keys=True).encode())
    h.update(targets.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def finetuned_classifier(encoder: ModelAdapter, items: Sequence[TextItem], targets: Tensor, n_tasks: int,
                         n_classes: int, cfg: FinetuneConfig, seed: int, cache_dir: Path, name: str,
                         progress: bool = True) -> tuple[ModelAdapter, bool]:
    """The classifier fine-tuned on (items, targets (n,) or (n, n_tasks)), from the cache when there.

    Returns (adapter, loaded_from_cache). ``cache_dir`` holds ``<name>-<key>.safetensors`` (and, while
    training, ``.partial`` checkpoints).
    """
    from cprobe.cache import build_lock
    from cprobe.models.load import fingerprint as weights_fingerprint

    targets = targets.reshape(len(items), n_tasks).long()
    if cfg.precision == "bf16" and not use_bf16(encoder.device):  # no native bf16 on this CPU: fp32 (logged once)
        cfg = replace(cfg, precision="fp32")
    cfg = replace(cfg, pool=cfg.pool or default_pool(encoder))  # the cache key names the φ actually trained
    key = train_key(weights_fingerprint(encoder), items, targets, n_tasks * n_classes, cfg, seed)
    with torch.random.fork_rng(devices=[]):  # the head's initialisation depends on the seed alone
        torch.manual_seed(seed)
        adapter = wrap(encoder, n_tasks * n_classes, cfg.pool, cfg.dropout, name=f"{name}-{key}")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    name = safe_name(name)  # e.g. liberty-<SCM name>: the SCM file's own `name:` field
    final = cache_dir / f"{name}-{key}.safetensors"
    with build_lock(str(final) + ".lock", f"the fine-tuned classifier {final.name}"):
        state = load_tensors(final)
        if state is not None:
            adapter.model.load_state_dict(state)
            return adapter, True
        _train(adapter, items, targets, n_classes, cfg, seed, cache_dir / f"{name}-{key}.partial.safetensors",
               progress, desc=f"fine-tune {name}")
        atomic_save_tensors(final, adapter.model.state_dict(), {"key": key, "config": json.dumps(asdict(cfg))})
        (cache_dir / f"{name}-{key}.partial.safetensors").unlink(missing_ok=True)
    return adapter, False


def _train(adapter: ModelAdapter, items: Sequence[TextItem], targets: Tensor, n_classes: int, cfg: FinetuneConfig,
           seed: int, checkpoint: Path, progress: bool, desc: str) -> None:
    from cprobe.progress import track

    model = adapter.model
    fmt = ClassificationFormatter(cfg.max_length)
    params = list(model.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    n = len(items)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warm = int(cfg.warmup * total)

    def factor(step: int) -> float:  # linear warm-up, then linear decay to zero (the HF Trainer default)
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    start = _resume(model, opt, sched, checkpoint)
    with warnings.catch_warnings():  # stepping the schedule before any optimizer step warns
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(start * steps_per_epoch):  # the learning-rate schedule where the checkpoint left it
            sched.step()
    gen = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n, generator=gen) for _ in range(cfg.epochs)]  # drawn up front: resuming is exact
    torch.manual_seed(seed)
    dev = adapter.device
    try:
        for epoch in track(range(start, cfg.epochs), desc, progress, total=cfg.epochs - start):
            model.train()
            torch.manual_seed(seed * 1000 + epoch)  # dropout masks reproducible per epoch
            for s in range(0, n, cfg.batch_size):
                rows = orders[epoch][s: s + cfg.batch_size]
                batch = fmt([items[int(i)] for i in rows], adapter, rows).to(dev)
                follow_load()  # a step is a pass: the cores other work leaves free (compute.follow_load)
                with torch.autocast(dev.type, torch.bfloat16, enabled=cfg.precision == "bf16"):
                    logits = model(batch.input_ids, batch.attention_mask).logits
                y = targets[rows].to(dev)
                loss = nn.functional.cross_entropy(logits.reshape(-1, n_classes).float(), y.reshape(-1),
                                                   ignore_index=IGNORE)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
            _checkpoint(model, opt, epoch + 1, checkpoint)
    finally:
        model.eval()
        for p in params:
            p.requires_grad_(False)


def _checkpoint(model: nn.Module, opt: torch.optim.Optimizer, epochs_done: int, path: Path) -> None:
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    tensors[f"opt.{k}.{names[id(p)]}"] = st[k]
            if "step" in st:
                tensors[f"opt.step.{names[id(p)]}"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    atomic_save_tensors(path, tensors, {"epochs_done": str(epochs_done)})


def _resume(model: nn.Module, opt: torch.optim.Optimizer, sched, path: Path) -> int:
    """Epochs already done according to ``path`` (0 without a valid checkpoint), restoring its state."""
    tensors = load_tensors(path)
    if tensors is None:
        return 0
    done = int(read_metadata(path).get("epochs_done", 0))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    for n, p in model.named_parameters():
        if f"opt.exp_avg.{n}" in tensors:
            opt.state[p] = {"exp_avg": tensors[f"opt.exp_avg.{n}"].to(p.device),
                            "exp_avg_sq": tensors[f"opt.exp_avg_sq.{n}"].to(p.device),
                            "step": tensors[f"opt.step.{n}"].reshape(()).clone()}
    log.info("resuming fine-tuning from %s after %d epoch(s)", path.name, done)
    return done


def classify(adapter: ModelAdapter, items: Sequence[TextItem], max_length: int | None = None,
             desc: str | None = None) -> tuple[Tensor, Tensor]:
    """(φ (n, d), class log-probabilities (n, n_out)) of a :func:`wrap`-ped classifier in one pass per batch."""
    from cprobe.models.readouts import ClassHead

    site = phi_site(adapter)
    out = adapter.map(list(items), ClassificationFormatter(max_length), read=[site], readout=ClassHead(), desc=desc)
    assert out.scores is not None
    return phi_of(adapter, out.acts[site]), out.scores


def phi_of(adapter: ModelAdapter, state: Tensor) -> Tensor:
    """φ (float32, CPU) from the states read at :func:`phi_site` of a :func:`wrap`-ped classifier."""
    model = adapter.model
    if model.pool != "pooler":
        return state
    p = next(model.parameters())
    with torch.inference_mode():
        out = [model.phi(chunk.to(p.device, p.dtype)).float().cpu() for chunk in state.split(4096)]
    return torch.cat(out) if out else state
