"""Model sets (``source: zoo``) and tiny LMs trained on a fact world's corpus (``source: fact_world``).

A zoo lists its ``members``: model config names (``conf/model/<name>.yaml``) or inline model configs. A fact-world
member trains a tiny BERT (``kind: mlm``) or GPT-NeoX (``kind: causal``) on a corpus sampled from the job's fact world
(:class:`cprobe.data.fact_world.CorpusSpec` under ``fact_world.corpus``, :class:`cprobe.models.tiny.TinyTrainConfig`
under ``fact_world.train``), cached under a key of the world, the corpus and the training settings; afterwards it is
an ordinary local checkpoint read through the one model entry point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cprobe.errors import ConfigError

_FACT_KEYS = {"corpus", "train"}
_ARCH = {"mlm": "bert", "causal": "neox"}


def members(model_cfg: Mapping[str, Any], names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The models a study probes: ``names`` (model config names) when given, else the zoo's members, else the one
    model. Each is checked as a model config; names must be unique."""
    from cprobe.models.load import parse_model_config
    from cprobe.paths import group_config

    if names:
        out = [group_config("model", n, "prompt_bias.models") for n in names]
    elif model_cfg.get("source") == "zoo":
        out = []
        for i, m in enumerate(model_cfg.get("members") or []):
            if isinstance(m, str):
                out.append(group_config("model", m, f"model.members[{i}]"))
            elif isinstance(m, Mapping):
                out.append({"dtype": model_cfg.get("dtype", "float32"), "device": model_cfg.get("device", "auto"),
                            **dict(m)})
            else:
                raise ConfigError(f"model.members[{i}] must be a model config name or mapping, got {m!r}")
    else:
        out = [dict(model_cfg)]
    for m in out:
        mc = parse_model_config(m)
        if mc.source == "zoo":
            raise ConfigError(f"model {mc.name!r}: a zoo member cannot be a zoo")
        if mc.kind not in ("mlm", "causal"):
            raise ConfigError(f"model {mc.name!r}: cloze probing needs kind mlm or causal, got {mc.kind!r}")
        if mc.source == "fact_world":
            fact_settings(m)
    names_seen = [m["name"] for m in out]
    dup = sorted({n for n in names_seen if names_seen.count(n) > 1})
    if dup:
        raise ConfigError(f"model name(s) {dup} appear twice among the probed models; give each a distinct name")
    return out


def fact_settings(m: Mapping[str, Any]) -> tuple[Any, Any]:
    """(CorpusSpec, TinyTrainConfig) of a fact-world member, checked."""
    from cprobe.data.fact_world import CorpusSpec
    from cprobe.models.tiny import TinyTrainConfig

    node = dict(m.get("fact_world") or {})
    unknown = sorted(set(node) - _FACT_KEYS)
    if unknown:
        raise ConfigError(f"model {m['name']!r}: unknown key(s) {unknown} under fact_world; known: {sorted(_FACT_KEYS)}")
    try:
        return CorpusSpec(**(node.get("corpus") or {})), TinyTrainConfig(**(node.get("train") or {}))
    except TypeError as e:
        raise ConfigError(f"model {m['name']!r}: bad fact_world setting ({e})") from None


def fact_model_dir(m: Mapping[str, Any], data: Any, cache_root: Path, progress: bool = True,
                   corpus: Any = None, init_from: Path | None = None) -> Path:
    """The trained checkpoint of fact-world member ``m`` on ``data``'s world (trained and cached on first use);
    ``corpus`` / ``init_from`` override its corpus and continue training another checkpoint (sample disparity)."""
    from cprobe.cache import kind_dir
    from cprobe.data.fact_world import sample_corpus
    from cprobe.models.tiny import ensure_corpus_model

    spec, train = fact_settings(m)
    spec = corpus or spec
    world = data.world
    key = {"world": asdict(world.keys), "corpus": spec.key()}

    def sentences() -> tuple[list[str], list[int]]:
        c = sample_corpus(data, spec)
        return c.sentences, c.object_word

    return ensure_corpus_model(_ARCH[m.get("kind", "mlm")], world.words(), sentences, key, train,
                               kind_dir(cache_root, "models"), init_from, progress)


def resolved(m: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """A fact-world member as an ordinary local checkpoint config."""
    return {**{k: v for k, v in m.items() if k != "fact_world"}, "source": "hub", "path": str(path)}
