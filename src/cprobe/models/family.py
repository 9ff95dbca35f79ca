"""Model families: everything cprobe needs to know about an architecture, in one record per HF ``model_type``.

A :class:`Family` says

- ``blocks``: where the transformer blocks live (a dotted path under the base model to an ``nn.ModuleList``);
- ``final_norm``: the base model's attribute holding the final normalisation the LM head reads (None: no final
  norm, as in post-LN encoders);
- ``position_offset``: position ids the model reserves before the first token (RoBERTa's padding index + 1 = 2),
  so ``max_position_embeddings − offset`` tokens fit;
- ``pool``: where a sequence classifier reads its summary of the text: the ``first`` token for encoders, the
  ``last`` real token for decoders;
- ``pooler``: whether the family's sequence classifier reads the base model's *pooler* (BERT: dense + tanh over
  [CLS], what ``BertForSequenceClassification`` and the CEBaB reference's explainers read) instead of the raw
  state at ``pool``;
- ``resumable``: whether an edited pass can resume at the edited layer (:mod:`cprobe.models.resume`): each block
  is called with the hidden states and returns them as one tensor (every listed family; a derived one is not
  assumed to, and runs the full forward);
- ``kv_resume``: whether a pass edited and read at the last token only can run that token alone above the edited
  layer over the prefix's clean key/value cache (:mod:`cprobe.models.resume`): a causal LM whose blocks take a HF
  ``DynamicCache`` and explicit position ids (every listed decoder — tested equal to the full forward). Where some
  layers attend within a sliding window (Mistral, Qwen 2/3 with ``use_sliding_window``, Gemma 2 and 3), the one-token
  step is exact only while the prefix fits the window: :func:`sliding_window` says how wide it is, and the adapter
  runs a wider batch's pass over every token above the edited layer instead;
- ``split_head``: whether the logits are the output embeddings' linear map of what they read (after the final norm and
  a masked LM's head transform, which the model runs) and then at most the soft cap ``logit_softcap`` names, nothing
  else — so a readout of a few tokens computes those rows of the head only (:mod:`cprobe.models.head`; every listed
  family, tested equal to the full head; a derived one is not assumed to, and runs the full head);
- ``logit_softcap``: the config key of the cap the model puts on its logits, ``cap · tanh(logits / cap)`` (Gemma 2
  and 3: ``final_logit_softcapping``, None there meaning no cap); None: the family caps nothing.

:func:`family_of` answers for a model config: the record when ``model_type`` is known, otherwise a record derived
from the HF config (decoder or encoder from the auto-class mappings and the declared architectures; blocks and final
norm then found on the module by the adapter), or a one-line :class:`ConfigError` naming what to set.

Adding a family = one line in :data:`MODEL_FAMILIES` (docs/architecture.md, "Add a model family").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cprobe.errors import ConfigError

Pool = Literal["first", "last"]

GENERIC_FINAL_NORMS = ("final_layer_norm", "ln_f", "norm")
"""Where an unknown decoder family's final norm is looked for, in this order."""


@dataclass(frozen=True)
class Family:
    """What cprobe needs to know about one architecture (module doc)."""

    model_type: str
    blocks: str | None  # None: found on the module (a ModuleList with one entry per layer)
    final_norm: str | None = None
    position_offset: int = 0
    pool: Pool | None = "first"  # None: a derived family whose config does not say (the classifier asks for it)
    pooler: bool = False
    derived: bool = False  # True when derived from the HF config rather than listed in MODEL_FAMILIES
    resumable: bool = True  # each block takes the hidden states and returns them as one tensor: a pass can resume
    kv_resume: bool = False  # a last-token pass can run one token over the prefix's clean key/value cache
    split_head: bool = True  # logits = soft cap of the output embeddings' map, nothing else: candidate rows only
    logit_softcap: str | None = None  # the config key of the logits' soft cap (Gemma 2 and 3)


def _decoder(model_type: str, blocks: str, final_norm: str, kv_resume: bool = False,
             logit_softcap: str | None = None) -> Family:
    return Family(model_type, blocks, final_norm, pool="last", kv_resume=kv_resume, logit_softcap=logit_softcap)


MODEL_FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("bert", "encoder.layer", pooler=True),
    Family("roberta", "encoder.layer", position_offset=2),
    Family("xlm-roberta", "encoder.layer", position_offset=2),
    Family("camembert", "encoder.layer", position_offset=2),
    Family("distilbert", "transformer.layer"),
    _decoder("gpt2", "h", "ln_f", kv_resume=True),
    _decoder("gpt_neox", "layers", "final_layer_norm", kv_resume=True),
    _decoder("llama", "layers", "norm", kv_resume=True),
    _decoder("mistral", "layers", "norm", kv_resume=True),
    _decoder("qwen2", "layers", "norm", kv_resume=True),
    _decoder("qwen3", "layers", "norm", kv_resume=True),
    _decoder("gemma", "layers", "norm", kv_resume=True),
    _decoder("gemma2", "layers", "norm", kv_resume=True, logit_softcap="final_logit_softcapping"),
    # Gemma 3's text model (a GGUF's Gemma3ForCausalLM): 5 sliding-window layers to 1 global, embeddings scaled by
    # √d inside the embedding module (layer 0 is the scaled state), four norms per block, the head tied to them
    _decoder("gemma3_text", "layers", "norm", kv_resume=True, logit_softcap="final_logit_softcapping"),
)}


def sliding_window(config: Any) -> int | None:
    """How many tokens back a sliding-window layer of this model attends (None: every layer attends to the whole
    prefix). Read from the config: ``layer_types`` naming a ``sliding_attention`` layer, or, for configs without
    ``layer_types`` (Mistral), a ``sliding_window`` set at all."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(window) if window else None


def family_of(config: Any) -> Family:
    """The family record of a HF model config (module doc): the listed one, else one derived from the config."""
    model_type = str(getattr(config, "model_type", "") or "")
    if model_type in MODEL_FAMILIES:
        return MODEL_FAMILIES[model_type]
    side = _side(config, model_type)
    return Family(model_type, None, None, 0, None if side is None else "last" if side == "decoder" else "first",
                  False, derived=True, resumable=False, split_head=False)


def pool_of(config: Any) -> Pool:
    """Where a sequence classifier on this model reads its summary; a one-line ConfigError when the family is
    unknown and its config does not say whether it is an encoder or a decoder."""
    family = family_of(config)
    if family.pool is None:
        raise ConfigError(
            f"unknown model family {family.model_type!r}: cprobe cannot tell from its config whether it is an encoder "
            f"or a decoder, so not where to read a text's summary; set finetune.pool=first (encoders) or last "
            f"(decoders), or add the family to cprobe.models.family.MODEL_FAMILIES (known: {sorted(MODEL_FAMILIES)})")
    return family.pool


def _side(config: Any, model_type: str) -> Literal["encoder", "decoder"] | None:
    """Encoder or decoder, from the config's own flags and architectures, then the auto-class mappings."""
    if getattr(config, "is_decoder", False):
        return "decoder"
    archs = [str(a) for a in (getattr(config, "architectures", None) or [])]
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "decoder"
    if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        return "encoder"
    try:
        from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                            MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    except ImportError:  # pragma: no cover - very old transformers
        return None
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder"
    return "decoder" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else None
