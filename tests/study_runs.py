"""One small finished run of every study, through the CLI, for tests that read a run's outputs (the records, the
leaderboard of `cprobe collect` over all of them, the HTML reports in a browser).

``study_runs(root)`` runs them once into ``root/<study>/`` (a rerun of a finished job is skipped by the pipeline, so
the session fixture in ``tests/conftest.py`` pays for them once per test session). Sizes are the smoke sizes of the
studies' own end-to-end tests (tiny self-trained or random models, tiny data written by the fixtures), so the six
together take about two minutes on 2 cores with a warm model cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("probing", "reliability", "causalgym", "cebab", "liberty", "prompt_bias")
RUN_DIRS = {s: f"{s}_run" for s in STUDIES} | {"causalgym": "causalgym_sweep"}
"""Where each study's run goes under the root (CausalGym: a two-job sweep over its methods, aggregated when it ends;
the others: one run each)."""


def _cprobe(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("cprobe")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=1200)


def study_commands(root: Path, shared_data: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Per study: the `cprobe run` arguments and extra environment (its data dir) of its smoke run."""
    from tests.cebab_fixtures import tiny_encoder_dir as cebab_encoder
    from tests.cebab_fixtures import write_cebab
    from tests.liberty_fixtures import tiny_encoder_dir as liberty_encoder
    from tests.liberty_fixtures import write_scm

    world = root / "_fixtures"
    cebab_data = world / "cebab_data"
    if not (cebab_data / "cebab").is_dir():
        write_cebab(cebab_data, n_train=40, n_eval=8)
    cebab_enc = world / "cebab_encoder"
    if not (cebab_enc / "config.json").is_file():
        cebab_encoder(cebab_enc)
    scm = world / "tiny.yaml"
    if not scm.is_file():
        world.mkdir(parents=True, exist_ok=True)
        write_scm(scm)
    lib_enc = world / "liberty_encoder"
    if not (lib_enc / "config.json").is_file():
        liberty_encoder(lib_enc)

    def run_dir(study: str) -> str:
        return f"hydra.run.dir={root / RUN_DIRS[study]}"

    shared = {"CPROBE_DATA_DIR": str(shared_data)}
    return {
        "probing": (["+experiment=sva_tiny", "--smoke", "layers=[2,4]", run_dir("probing")], shared),
        "reliability": (["+experiment=sva_tiny_reliability", "intervention=mean_diff", "--smoke",
                         run_dir("reliability")], shared),
        "causalgym": (["-m", "+experiment=causalgym", "causalgym.tasks=[agr_sv_num_pp]", "causalgym.n_train=8",
                       "causalgym.n_eval=4", "layers=[1,2]", "causalgym.methods=[das,mean],[random]",
                       "causalgym.oracle_probe.widths=[32]", "causalgym.oracle_probe.lrs=[0.01]",
                       "causalgym.oracle_probe.epochs=4", "causalgym.random_draws=2",
                       "model.tiny.train.steps=30", "+model.tiny.train.layers=2", "model.tiny.grammar.n_sentences=300",
                       "model.tiny.causalgym_corpus.n_per_task=50",
                       "model.tiny.causalgym_corpus.tasks=[agr_sv_num_pp]", "progress=false", "device=cpu",
                       f"hydra.sweep.dir={root / RUN_DIRS['causalgym']}"], shared),
        "cebab": (["+experiment=cebab", "model=bert_base_uncased", f"model.path={cebab_enc}", "model.finetune.lr=3e-3",
                   "model.finetune.max_length=64", "--smoke", "cebab.explainers=[random,approx,conceptshap,leace]",
                   "cebab.explainer.conceptshap.hidden=16", run_dir("cebab")], {"CPROBE_DATA_DIR": str(cebab_data)}),
        "liberty": (["+experiment=liberty_cv", f"dataset.scm={scm}", "dataset.n_explained=150",
                     "dataset.n_explainer=60", "model=bert_base_uncased", f"model.path={lib_enc}",
                     "model.finetune.lr=3e-3", "liberty.finetune.max_length=64", "liberty.concept_model.max_length=64",
                     "--smoke", "liberty.explainers=[random,approx,ft_match,conceptshap]",
                     "liberty.explainer.conceptshap.hidden=16", run_dir("liberty")], shared),
        "prompt_bias": (["+experiment=lama_bias", "model=fact_zoo_smoke", "--smoke", "dataset.n_relations=6",
                         "dataset.facts_per_relation=10", "dataset.n_entities=40", "prompt_bias.subset=4",
                         run_dir("prompt_bias")], shared),
    }


def study_runs(root: Path, shared_data: Path, studies: tuple[str, ...] = STUDIES) -> dict[str, Path]:
    """Run (or reuse) one smoke run per study under ``root``; returns {study: run (or sweep) dir}. Raises on a failed
    run."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    commands = study_commands(root, shared_data)
    out = {}
    for study in studies:
        args, extra = commands[study]
        env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", **extra}
        env.setdefault("CPROBE_CACHE_DIR", str(REPO / ".cache" / "cprobe-test"))
        r = _cprobe(["run", *args], cwd=root, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"the {study} smoke run failed:\n{r.stderr[-3000:]}")
        out[study] = root / RUN_DIRS[study]
    return out
