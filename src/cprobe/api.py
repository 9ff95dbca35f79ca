"""The library path, without Hydra: models and datasets by config name, hidden states at sites, edits written
back into the model. Everything here is re-exported at the package top (``cprobe.load_model`` ...).

A config name is a file of the config group (``conf/model/<name>.yaml``, ``conf/dataset/<name>.yaml``, as
``cprobe list model`` / ``cprobe list dataset`` show); keyword overrides replace its keys. Mappings work too,
``${...}`` interpolations of the shipped YAML files included. The cache and data directories are the CLI's
(``$CPROBE_CACHE_DIR``, ``$CPROBE_DATA_DIR``; :mod:`cprobe.paths`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cprobe.compute import policy_kept, set_wait_policy
from cprobe.errors import ConfigError, CprobeError, JobAborted
from cprobe.paths import cache_dir, config_dir, data_dir, environ, group_config


def _resolved(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with its ``${...}`` interpolations resolved as the CLI would without a compute group
    (``${oc.select:compute.dtype,float32}`` -> ``float32``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True)  # type: ignore[return-value]


def model_config(name: str | Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """The ``model`` config of a name from ``conf/model/`` (or a mapping), overrides applied, resolved."""
    return {**(group_config("model", name) if isinstance(name, str) else _resolved(name)), **overrides}


def dataset_config(name: str | Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """The ``dataset`` config of a name from ``conf/dataset/`` (or a mapping), overrides applied, resolved."""
    return {**(group_config("dataset", name) if isinstance(name, str) else _resolved(name)), **overrides}


def load_model(name: str | Mapping[str, Any], progress: bool = False, **overrides: Any):
    """A :class:`~cprobe.models.adapter.ModelAdapter` for a model config name (``"tiny_bert_sva"``,
    ``"pythia_70m"``, ...) or mapping; ``device="cuda"``, ``path="/local/dir"``, ``batch_size=64`` ... override
    its keys. The project's tiny models are trained (and cached) the first time they are asked for."""
    from cprobe.models.load import load_adapter

    return load_adapter(model_config(name, **overrides), cache_dir(), progress, data_dir())


def load_dataset(name: str | Mapping[str, Any], data_root: str | Path | None = None, **overrides: Any):
    """The dataset of a config name (``"synthetic_sva"``, ``"lgd"``, ``"generic"`` with ``path=...``) or mapping,
    loaded and checked as a job does; ``max_examples=600`` etc. override its keys.

    For agreement data (a :class:`~cprobe.data.base.Dataset`): ``data.properties`` names the properties,
    ``data.values("z_c")`` their values (``"none"`` excluded), ``data.labels("z_c")`` the integer labels (index
    into those values; −1 where the property does not apply), ``data.examples[i].props`` one item's values, and
    ``data.notes`` what loading changed (e.g. duplicates dropped)."""
    from cprobe.data.registry import load_dataset as _load

    data = _load(dataset_config(name, **overrides), Path(data_root) if data_root is not None else data_dir())
    for note in getattr(data, "notes", ()):
        logging.getLogger("cprobe").info("%s", note)
    return data


def read_sites(model: Any, data: Any, layers: str | int | Sequence[int] = "all", position: str = "target",
            cache: bool = True, progress: bool = False):
    """Hidden states of agreement items at ``layers`` (``"all"``, ``"last"``, ints; 0 = embeddings) and
    ``position`` (``"target"``: the [MASK] / the last prefix token), and the model's scores of the two verb forms.

    Returns an :class:`~cprobe.extract.Extraction`: ``.acts[layer]`` (n, d) float32, ``.dataset`` (the items kept:
    verb forms single tokens of the model's vocabulary), ``.scores`` (n, 2) logits of (correct, wrong) — compare
    within a row (their difference is the log-probabilities'; :mod:`cprobe.models.readouts`), ``.task_accuracy``. With ``cache`` the states are read from / written to the activation cache."""
    from cprobe.cache import ActivationCache
    from cprobe.extract import extract as _extract, resolve_layers

    return _extract(model, data, resolve_layers(layers, model.n_layers), position,
                    ActivationCache(cache_dir(), enabled=cache), progress)


def intervene(model: Any, extraction: Any, layer: int, states: Any, position: str = "target"):
    """Run the model again with the states at (``layer``, ``position``) replaced by ``states`` (n, d) — e.g. an
    eraser's output — for every item of ``extraction``; returns the new (n, 2) logits of (correct, wrong)
    (``task_accuracy`` of them: the agreement accuracy after the edit)."""
    from cprobe.models.edits import Replace
    from cprobe.models.formatters import AgreementFormatter
    from cprobe.models.readouts import CandidateTokens
    from cprobe.models.sites import Site

    items = extraction.dataset.examples
    if len(states) != len(items):
        raise ConfigError(f"states has {len(states)} rows, the extraction {len(items)} items")
    return model.map(items, AgreementFormatter((position,)), edits={Site(layer, position): Replace(states)},
                     readout=CandidateTokens(extraction.candidates)).scores


def task_accuracy(scores: Any) -> float | None:
    """Share of items whose correct verb form scores above the wrong one (scores (n, 2); None without scores)."""
    from cprobe.extract import task_accuracy as _acc

    return _acc(scores)


def run(*overrides: str, smoke: bool | None = None) -> Path:
    """Run an experiment in this process exactly as ``cprobe run OVERRIDES`` does — the same composition,
    validation, job, outputs and cache — and return its directory: the run's, or the sweep's for ``-m``. E.g.
    ``cprobe.run("+experiment=sva_tiny_reliability", "intervention=leace")``, then
    ``pandas.read_parquet(run_dir / "records.parquet")``.

    ``overrides`` are the command line's Hydra overrides (``"-m"`` makes it a sweep); ``smoke`` adds
    ``+debug=smoke`` (None: when ``CPROBE_SMOKE=1``, as the CLI). Methods registered in this process with
    :func:`cprobe.plugin.register` can be named (``intervention=custom intervention.name=mine``). A bad config raises
    :class:`~cprobe.errors.ConfigError` with the CLI's one line, before any run directory exists; a failed sweep job
    raises :class:`~cprobe.errors.CprobeError` naming it. The process is left as it was found (working directory,
    logging handlers — the job's log file closed —, torch threads, Hydra's global state). Called before torch is
    imported, it sets OpenMP's wait policy as the CLI does (:func:`cprobe.compute.set_wait_policy`)."""
    argv = [str(a) for a in overrides]
    set_wait_policy(argv, measure=True)  # before the imports below load torch (a no-op where torch is loaded already)
    from cprobe import _hydra, callbacks, pipeline

    flags = [a for a in argv if a.startswith("-") and a not in ("-m", "--multirun")]
    if flags:
        raise ConfigError(f"cprobe.run takes overrides and -m, not {flags}; the other flags (--cfg, --info, "
                          "--detach) are the command line's: `cprobe run ...`")
    if not any(a.lstrip("+").startswith("experiment=") for a in argv):
        raise ConfigError("cprobe.run needs an experiment, e.g. cprobe.run('+experiment=sva_tiny') "
                          "(`cprobe list experiment` shows them)")
    argv, notes = _hydra.normalise(argv)
    for note in notes:
        logging.getLogger("cprobe").info("%s", note)
    if smoke is None:
        smoke = os.environ.get("CPROBE_SMOKE", "") not in ("", "0")
    if smoke and "+debug=smoke" not in argv:
        argv.append("+debug=smoke")
    callbacks.reset()
    before = len(callbacks.DIRS)
    with _process_kept(), environ(HYDRA_FULL_ERROR="1"):  # errors reach this function, not Hydra's printer
        try:
            _hydra.run(argv, pipeline.run_job, str(config_dir()))
        except JobAborted as e:
            raise e.error from None
        except Exception as e:
            msg = _hydra.explain_error(e)
            if msg is None:
                raise
            raise ConfigError(msg) from None
    if callbacks.FAILED or callbacks.REPORT_FAILED:
        from cprobe.job import failure_line

        raise CprobeError(failure_line(callbacks.FAILED, callbacks.REPORT_FAILED))
    if len(callbacks.DIRS) == before:  # a run and a sweep's end both record theirs
        raise CprobeError("the run did not report its directory")
    return callbacks.DIRS[-1]


@contextmanager
def _process_kept() -> Iterator[None]:
    """What a Hydra job changes in its process, given back afterwards: the working directory, the root logger's
    handlers and level (Hydra points them at the job's log file, which is closed here), torch's thread count and
    cprobe's thread policy (:func:`cprobe.compute.policy_kept`),
    matplotlib's backend (a study's figures are drawn headless: a notebook's inline backend comes back), the global
    Hydra instance."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    backend = sys.modules["matplotlib"].get_backend() if "matplotlib.pyplot" in sys.modules else None
    here = os.getcwd()
    try:
        with policy_kept():  # the job's thread policy: its passes follow the load, the notebook's are its own
            yield
    finally:
        os.chdir(here)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
        torch = sys.modules.get("torch")
        if threads is not None and torch is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if backend is not None and sys.modules["matplotlib"].get_backend() != backend:
            sys.modules["matplotlib"].use(backend)
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
