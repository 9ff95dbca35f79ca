"""cprobe: a config-driven causal-probing workbench for language models.

Models and datasets load by config name, without Hydra (the README's "Python" section runs as written)::

    import cprobe
    model = cprobe.load_model("tiny_bert_sva")                     # `cprobe list model`
    data = cprobe.load_dataset("synthetic_sva", max_examples=600)  # `cprobe list dataset`
    ex = cprobe.read_sites(model, data, layers=[4])                 # ex.acts[4]: (n, d) at the [MASK]
    z = torch.from_numpy(ex.dataset.labels("z_c"))                 # class ids (-1: the property does not apply)
    X_erased = cprobe.LEACE().fit(ex.acts[4], z).transform(ex.acts[4])
    cprobe.task_accuracy(cprobe.intervene(model, ex, layer=4, states=X_erased))
    run_dir = cprobe.run("+experiment=sva_tiny_reliability", "intervention=leace")  # a whole job, as `cprobe run`

The estimators are importable from the package top for use in a notebook, e.g.::

    from cprobe import LEACE, INLP, LinearProbe
    eraser = LEACE().fit(X, z)          # X: (n, d) float tensor, z: (n,) int64 class ids
    X_erased = eraser.transform(X)
    LinearProbe(seed=0).fit(X_erased, z).score(X_erased, z)   # ~ majority rate

    eraser = LEACE()                    # activation sets that do not fit in memory: stream the batches
    for X_batch, z_batch in batches:
        eraser.update(X_batch, z_batch)
    X_erased = eraser.transform(X)

Names resolve lazily (``cprobe --help`` must not import torch).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # interventions on activations (Canby et al. 2024)
    "INLP": "cprobe.interventions.inlp",
    "RLACE": "cprobe.interventions.rlace",
    "LEACE": "cprobe.interventions.leace",
    "AlterRep": "cprobe.interventions.alterrep",
    "MeanDiff": "cprobe.interventions.mean_diff",
    "FGSM": "cprobe.interventions.fgsm",
    "PGD": "cprobe.interventions.pgd",
    "AutoAttack": "cprobe.interventions.autoattack",
    # direction finders (Arora et al. 2024)
    "DAS": "cprobe.directions.das",
    # probes
    "LinearProbe": "cprobe.probes.linear",
    "MLPProbe": "cprobe.probes.mlp",
    # registries
    "INTERVENTIONS": "cprobe.interventions",
    "DIRECTIONS": "cprobe.directions",
    "PROBES": "cprobe.probes",
    # the model entry point and its vocabulary
    "ModelAdapter": "cprobe.models.adapter",
    "Site": "cprobe.models.sites",
    "load_adapter": "cprobe.models.load",
    # the library path (cprobe.api): by config name, without Hydra
    "model_config": "cprobe.api",
    "dataset_config": "cprobe.api",
    "load_model": "cprobe.api",
    "load_dataset": "cprobe.api",
    "read_sites": "cprobe.api",
    "intervene": "cprobe.api",
    "task_accuracy": "cprobe.api",
    "run": "cprobe.api",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cprobe' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
