"""The studies' tables pinned across the sites-engine refactor (issue 31 item 2): a small reliability job of every
run shape (one site read where it is edited; read at every later layer; several sites, sequential and simultaneous;
an intervention that attacks a probe; one trained through the model) and a CausalGym task table (direction methods,
DAS, erasers and a gradient attack, with downstream read layers) give exactly the values the code before the refactor
gave (``tests/data/sites_golden/*.csv``, written from the unmodified code at the same seed).

Compared exactly (``check_exact``), all columns but the timings (``*_s``) and where the oracle / interventional probes
came from (``probe_source``: fitted, memory or disk depends on the cache's state). The values are CPU float32 ones;
``CPROBE_WRITE_GOLDEN=1`` rewrites them (only from code known to be right). They were written with
:data:`THREADS` torch intra-op threads, and the jobs here run with as many: DAS trains through the model, and its
float32 sums depend on how the matrix products are split among threads (with 1 thread its completeness differs in the
7th digit)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from cprobe.compute import threads

from tests.integration.test_causalgym_interventions import FAST
from tests.integration.test_causalgym_task import ORACLE, _settings, adapter, template  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "sites_golden"
BASE = ["+experiment=sva_tiny_reliability", "+debug=smoke", "layers=2", "reliability.oracle_probe=linear",
        "reliability.interventional_probe=linear", "seed=3"]
RELIABILITY = {
    "leace_plain": ["intervention=leace"],
    "mean_diff_plain": ["intervention=mean_diff"],
    "fgsm_plain": ["intervention=fgsm"],
    "das_plain": ["intervention=das"],
    "rlace_plain": ["intervention=rlace", "intervention.max_steps=200"],  # its fit_steps_run / fit_converged columns
    "leace_read_all": ["intervention=leace", "reliability.read_layers=all"],
    "das_read_all": ["intervention=das", "reliability.read_layers=all"],
    "leace_sequential": ["intervention=leace", "reliability.sites=[2,3]", "reliability.mode=sequential",
                         "reliability.read_layers=all"],
    "mean_diff_sites": ["intervention=mean_diff", "reliability.sites=[1,3]", "reliability.read_layers=[3,4]"],
    "pgd_sites": ["intervention=pgd", "reliability.sites=[2,3]"],
}
SKIP = ("probe_source",)
THREADS = 2


def _frame(t: pd.DataFrame) -> pd.DataFrame:
    t = t[[c for c in t.columns if not c.endswith("_s") and c not in SKIP]]
    return t.reset_index(drop=True)


def reliability_table(name: str, root: Path, resume: bool = False) -> pd.DataFrame:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe.job import JobContext, seed_everything
    from cprobe.pipeline import prepare

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*BASE, *RELIABILITY[name], f"compute.resume={str(resume).lower()}"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    job = prepare(plain)
    out = root / name
    out.mkdir(parents=True)
    cache = Path(os.environ.get("CPROBE_CACHE_DIR") or REPO / ".cache" / "cprobe-test")
    ctx = JobContext(cfg={**plain, "paths": {}}, out_dir=out, data_root=Path(os.environ["CPROBE_DATA_DIR"]),
                     cache_root=cache, progress=False)
    seed_everything(3)
    with threads(THREADS):
        res = job.task.run(ctx, job.task_cfg)
    items = pd.read_parquet(out / "reliability_items.parquet")
    pd.testing.assert_frame_equal(res.items, items)  # the per-item values the records get are the documented file's
    return _frame(res.table), items


def causalgym_table(adapter, template) -> pd.DataFrame:  # noqa: F811
    from cprobe.job import seed_everything
    from cprobe.tasks import causalgym_engine as engine
    from cprobe.tasks.causalgym_engine import run_gym_task

    seed_everything(5)
    s = _settings(methods=["mean", "random", "das", "vanilla", "leace", "mean_diff", "pgd", "rlace"], layers=[1, 2],
                  reliability=True, oracle_probe=ORACLE, read_layers=True,
                  interventions={**engine.DEFAULT_INTERVENTIONS, **FAST})
    with threads(THREADS):
        return _frame(pd.DataFrame(run_gym_task(adapter, template, *s, seed=5)))


def _check(got: pd.DataFrame, stem: str, exact: bool = True) -> None:
    """``got`` equals the pinned table exactly, or within 1e-5 (``CPROBE_WRITE_GOLDEN=1``: pins it instead)."""
    path = GOLDEN / f"{stem}.parquet"
    if exact and os.environ.get("CPROBE_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        got.to_parquet(path)
    if exact:
        pd.testing.assert_frame_equal(got, pd.read_parquet(path), check_exact=True)
    else:
        pd.testing.assert_frame_equal(got, pd.read_parquet(path), check_exact=False, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(RELIABILITY))
def test_a_reliability_job_gives_the_pinned_table_and_items(name, tmp_path):
    """With full forwards (``compute.resume=false``) the refactored code gives the old code's values bit for bit."""
    table, items = reliability_table(name, tmp_path)
    _check(table, f"reliability_{name}")
    _check(items, f"reliability_{name}_items")


@pytest.mark.parametrize("name", sorted(RELIABILITY))
def test_resumed_passes_give_the_pinned_table_within_float_tolerance(name, tmp_path):
    """With ``compute.resume`` (issue 35): the edited pass over the scored items resumes at its lowest edited or read
    layer from clean states in the activation cache, DAS's training steps and the sequential refits at the edited
    layer: the same table within 1e-5 (the resumed blocks sum in another order, so the last bits may differ)."""
    table, items = reliability_table(name, tmp_path, resume=True)
    _check(table, f"reliability_{name}", exact=False)
    _check(items, f"reliability_{name}_items", exact=False)


def test_a_causalgym_task_gives_the_pinned_table(adapter, template):  # noqa: F811
    """Exactly, with the last-token passes resumed as any other (``kv_resume`` off: the blocks above the edit run
    every token, in the same order as before)."""
    adapter.kv_resume = False
    try:
        _check(causalgym_table(adapter, template), "causalgym")
    finally:
        adapter.kv_resume = True


def test_a_causalgym_task_over_the_prefix_cache_gives_the_pinned_table_within_float_tolerance(adapter, template):  # noqa: F811,E501
    """DAS passes whose sites are all at the rows' last token run that token alone over the prefix's clean key/value
    cache (models/resume.py): the same table within 1e-5 (one token's products sum in another order: measured 3e-8
    absolute, 1.4e-6 relative)."""
    assert adapter.can_kv_resume
    _check(causalgym_table(adapter, template), "causalgym", exact=False)
