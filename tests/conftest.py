"""Shared fixtures: offline env, tiny random HF models with word-level tokenizers, data-dir skips."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

os.environ.setdefault("CPROBE_STRICT_FIGURES", "1")  # a figure whose title does not name what it shows fails


def _share_cores_among_workers() -> None:
    """Under ``pytest -n N`` each worker (and every process it starts: the env is inherited) gets its share of the
    cores as its intra-op threads, unless ``OMP_NUM_THREADS`` is set. Measured on 2 cores: two CEBaB smoke runs side
    by side took 275 s with 2 threads each (oversubscribed OpenMP threads spin) and 106 s with 1 each."""
    n_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if n_workers < 2 or os.environ.get("OMP_NUM_THREADS"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = str(max(1, cores // n_workers))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = share
    import sys

    if "torch" in sys.modules:  # already imported (a plugin): its pool was sized from the old environment
        sys.modules["torch"].set_num_threads(int(share))


_share_cores_among_workers()


@pytest.fixture(scope="session", autouse=True)
def _a_fixed_thread_count():
    """Without xdist workers (``pytest -n 0``, ``make test-real``), every core as the jobs' count, set where
    ``_share_cores_among_workers`` sets a worker's share (a session fixture runs where tests run, never in xdist's
    controller, whose environment its workers would inherit). A count set in the environment is fixed: the jobs'
    passes never follow the load (``compute.follow_load``), so a run's results never depend on what else the box runs
    meanwhile."""
    if not os.environ.get("OMP_NUM_THREADS"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(cores)
    yield

from tests import cli  # noqa: E402  (after the environment above)

cli.count_processes()  # every subprocess the suite starts, `cprobe` launches apart: printed in the summary

from cprobe._hydra import compose_defaults_once, parse_configs_once  # noqa: E402

parse_configs_once()  # the suite composes over a thousand configs in process: each YAML file parsed once, as a sweep does
compose_defaults_once()  # and each set of config choices merged once, as `cprobe run` does

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CPROBE_DATA_DIR", REPO.parent / "shared" / "data"))
os.environ.setdefault("CPROBE_DATA_DIR", str(SHARED_DATA))

SEEDED_MODELS = REPO / "tests" / "data" / "models"
"""The suite's checked-in tiny models (tests/data/models/README.md): the ones a cold suite would spend most of its
time training, as the cache entries the suite itself wrote (weights, tokenizer, training.json, checksums.json)."""
TRAIN_ENV = "CPROBE_TEST_TRAIN_MODELS"
"""Set to 1 to train every model in the suite instead (``make test-portable`` does: the second pass trains its own
on the portable kernels)."""
SLOW_TRAINING_S = 10.0
"""A model the suite trained for longer than this in a session is named in the summary (a missing or stale seed)."""


def seed_models(cache: Path, seeds: Path = SEEDED_MODELS) -> list[str]:
    """Put the checked-in models into ``cache/models`` where an entry of that name is missing; returns the names
    put there. Each is copied beside its place and renamed into it (a worker that loses the race drops its copy);
    the cache checks each entry's checksums and key on read as for any entry, and rebuilds one that fails."""
    import shutil

    if os.environ.get(TRAIN_ENV, "") not in ("", "0") or not seeds.is_dir():
        return []
    put = []
    for src in sorted(p for p in seeds.iterdir() if p.is_dir()):
        dst = cache / "models" / src.name
        if dst.exists():
            continue
        tmp = dst.with_name(f".{src.name}.seed-{os.getpid()}")
        shutil.copytree(src, tmp)
        try:
            tmp.rename(dst)
            put.append(src.name)
        except OSError:  # another worker put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return put


SESSION_START = time.time()
"""When this process loaded the suite: a model trained after it was trained in this session."""


def numeric_threads(default: int) -> int:
    """Torch intra-op threads for a test that sets its own: ``CPROBE_TEST_THREADS`` when set (``make test-portable``
    runs the ``numeric`` tests with 1 and with 2, ``OMP_NUM_THREADS`` set alike), else the test's ``default``."""
    return int(os.environ.get("CPROBE_TEST_THREADS") or default)


WORDS = ("the author authors guard guards near that like likes is are was were has have here , .".split()
         + [f"w{i}" for i in range(20)])


def needs_shared(*parts: str):
    """Skip unless ``../shared/data/<parts>`` exists (CI has it; a bare clone may not)."""
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"needs {path} (the shared data dir; set CPROBE_DATA_DIR)")


def read_caption(path: Path) -> dict[str, str] | None:
    """The caption stored in a PNG written by :func:`cprobe.plots.save` (None when it has none)."""
    import json

    from PIL import Image

    from cprobe.plots import CAPTION_KEY

    with Image.open(path) as im:
        raw = dict(getattr(im, "text", {}) or {}).get(CAPTION_KEY)
    return json.loads(raw) if raw else None


def assert_figures_captioned(directory: Path) -> list[Path]:
    """Every PNG under ``directory`` names the property, model, data and n (and the seed) in its title, and
    carries that caption in its metadata. Returns the PNGs checked."""
    from cprobe.plots import FIELDS, missing_fields

    pngs = sorted(Path(directory).rglob("*.png"))
    for png in pngs:
        cap = read_caption(png)
        assert cap is not None, f"{png.name} has no caption"
        assert not missing_fields(cap), f"{png.name}: title {cap['title']!r} lacks {missing_fields(cap)}"
        assert all(f"{f}: {cap[f]}" in cap["title"] for f in FIELDS), cap["title"]
    return pngs


def _data_skip(report) -> bool:
    """A skip because a data file is missing: its reason names the data dir or CPROBE_DATA_DIR."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return str(SHARED_DATA) in reason or "CPROBE_DATA_DIR" in reason or "shared data" in reason


SESSION_GROUPS = {
    # files whose tests share one session-scoped run: they go to one worker, so it is made once
    "study_runs": ("tests/smoke/test_readme.py", "tests/smoke/test_studies_collect.py",
                   "tests/smoke/test_report_browser.py", "tests/integration/test_mib_task.py"),
    "slurm": ("tests/slurm/",),  # one test cluster per session
}
FIRST = ("study_runs", "slurm", "tests/smoke/test_e2e.py", "tests/integration/test_reference_erasers.py",
         "tests/integration/test_causalgym_task.py", "tests/smoke/test_cli_contract.py",
         "tests/integration/test_prompt_bias_task.py", "tests/integration/test_cebab_task.py",
         "tests/smoke/test_reliability_e2e.py", "tests/smoke/test_trackers_e2e.py", "tests/smoke/test_plugin_example.py",
         "tests/integration/test_yardsticks_sweep.py", "tests/unit/test_configs.py", "tests/unit/test_rlace.py",
         "tests/integration/test_sites_golden.py", "tests/unit/test_hydra_parse.py",
         "tests/integration/test_liberty_task.py", "tests/integration/test_axbench_task.py",
         "tests/integration/test_sae_yardsticks.py", "tests/unit/test_probes.py", "tests/smoke/test_notebook.py",
         "tests/integration/test_ravel_task.py", "tests/integration/test_effects_engine.py")
"""The longest groups, longest first (cold, on 2 cores: the README's study runs ~720 s, then 115 s down to 15 s); the
workers then share out the rest in file order. A long group left to the end would be the suite's tail."""


def pytest_configure(config):
    """xdist (3.6 and later) orders the work units by their number of tests unless told not to
    (``--no-loadscope-reorder``): that put the long groups of few tests (the reference erasers, the plugin example,
    the yardsticks sweep: 45-100 s each) at the end, behind the README's group on one worker, while the other one
    waited (a tail of ~100 s). :data:`FIRST`'s order is kept instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def xdist_group(nodeid: str) -> str:
    """The unit of work a parallel run (``pytest -n 2``, what ``make test`` runs) gives one worker: a test file (its
    tests keep their order, and module fixtures are made once), or a session group of files."""
    path = nodeid.split("::", 1)[0]
    for group, prefixes in SESSION_GROUPS.items():
        if path.startswith(prefixes):
            return group
    return path


ON_REQUEST = ("bench", "real")
"""Markers whose tests run only when a ``-m`` expression names them."""


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the marks
def pytest_collection_modifyitems(config, items):
    """Benchmark scripts (``@pytest.mark.bench``) and the real-model runs (``@pytest.mark.real``) run only when asked
    for (``pytest -m bench``, ``make bench``; ``pytest -m real``, ``make test-real``); in a parallel run every test is
    marked with its :func:`xdist_group`, the longest groups first."""
    for marker in ON_REQUEST:
        if marker not in (config.getoption("markexpr") or ""):
            keep = [it for it in items if it.get_closest_marker(marker) is None]
            if len(keep) < len(items):
                config.hook.pytest_deselected(items=[it for it in items if it.get_closest_marker(marker) is not None])
                items[:] = keep
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):  # an xdist worker under --dist loadgroup
        return
    for it in items:
        if it.get_closest_marker("xdist_group") is None:
            it.add_marker(pytest.mark.xdist_group(xdist_group(it.nodeid)))
    rank = {g: i for i, g in enumerate(FIRST)}
    items.sort(key=lambda it: rank.get(xdist_group(it.nodeid), len(FIRST)))  # stable: file order kept otherwise


def pytest_sessionstart(session):
    """The checked-in models go into the suite's cache before any test asks for one (:func:`seed_models`)."""
    seed_models(suite_cache())


def trained_this_session(cache: Path, since: float = SESSION_START) -> list[tuple[str, float]]:
    """(name, training seconds) of the tiny models written into ``cache/models`` since ``since`` that took longer than
    :data:`SLOW_TRAINING_S` to train: what a seed would have saved."""
    import json

    out = []
    for report in sorted((cache / "models").glob("*/training.json")):
        if report.stat().st_mtime < since:
            continue
        try:
            seconds = float(json.loads(report.read_text()).get("train_seconds") or 0)
        except (OSError, ValueError):
            continue
        if seconds > SLOW_TRAINING_S:
            out.append((report.parent.name, seconds))
    return out


def pytest_sessionfinish(session, exitstatus):
    """An xdist worker hands its process counts to the controller, which prints the suite's sum."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["cprobe_counts"] = dict(cli.COUNTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up what each worker counted (``pytest -n``: the summary is printed by the controller)."""
    cli.COUNTS.update(getattr(node, "workeroutput", {}).get("cprobe_counts", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How many processes the suite started (`cprobe` launches apart), and one line naming the data-dependent tests
    that were skipped and why, so a clone without ``../shared/data`` does not pass silently on less than the whole
    suite."""
    terminalreporter.write_line(cli.summary(), yellow=cli.COUNTS["cprobe"] > cli.LAUNCH_TARGET)
    slow = [] if os.environ.get(TRAIN_ENV, "") not in ("", "0") else trained_this_session(suite_cache())
    if slow:
        terminalreporter.write_line(
            f"models: the suite trained {len(slow)} model(s) for over {SLOW_TRAINING_S:.0f} s this session ("
            + ", ".join(f"{n} {s:.0f} s" for n, s in slow) + f"): a missing or stale seed in {SEEDED_MODELS} "
            "(its README.md says how to refresh them)", yellow=True, bold=True)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if _data_skip(r)]
    if not skipped:
        return
    names = sorted({r.nodeid.split("::", 1)[-1].split("[")[0] for r in skipped})
    where = "not found" if not SHARED_DATA.is_dir() else "incomplete"
    terminalreporter.write_line(
        f"data: {len(skipped)} data-dependent test(s) skipped because the data dir {SHARED_DATA} is {where} "
        f"(put the shared data beside the clone as ../shared/data, or set CPROBE_DATA_DIR): {', '.join(names)}",
        yellow=True, bold=True)


def make_word_tokenizer(kind: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if kind == "mlm" else ["<|endoftext|>", "[UNK]"]
    vocab = {w: i for i, w in enumerate(specials + list(WORDS))}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if kind == "mlm":
        t.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                       sep_token="[SEP]", mask_token="[MASK]")
    t.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", vocab["<|endoftext|>"])])
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", unk_token="[UNK]")


def write_activations(root: Path, fields: dict, tensors: dict, shard_rows: int | None = None):
    """An activation entry under cache root ``root`` written as extraction writes one (``extract.extract_stream``:
    its lock, fixed row ranges of ``shard_rows`` (default: one shard), a checksummed file per tensor and range, then
    ``meta.json``); returns the :class:`cprobe.cache.Entry`."""
    from cprobe.cache import ActivationCache

    n = len(next(iter(tensors.values())))
    entry = ActivationCache(root).entry(fields, n)
    with entry.lock():
        entry.init(shard_rows or n)
        for name, t in tensors.items():
            for j, (a, b) in enumerate(entry.ranges()):
                entry.write(name, j, t[a:b])
        entry.finish()
    return entry


SLIDING = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
"""The families whose configs can give some layers a sliding attention window (make_random_model's ``window``)."""


def make_random_model(arch: str, seed: int = 0, window: int | None = None):
    """A tiny random-init HF model (no download) and its tokenizer: arch in bert | roberta | gpt_neox | gpt2 | llama |
    mistral | qwen2 | qwen3 | gemma | gemma2 | gemma3_text. For the :data:`SLIDING` families ``window`` sets the
    attention window of their sliding layers (Mistral: every layer; Qwen 2/3: the layers above the first; Gemma 2 and
    3: layers 1 and 3 of 3, layer 2 global) — None: the config's default; the Gemma norms get random weights too."""
    import torch
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, GPTNeoXConfig,
                              GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM)

    torch.manual_seed(seed)
    tok = make_word_tokenizer("mlm" if arch in ("bert", "roberta") else "causal")
    V = len(tok)
    if arch == "bert":
        m = BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64))
    elif arch == "roberta":  # position ids count from the padding index + 1, as RoBERTa's
        from transformers import RobertaConfig, RobertaForMaskedLM

        m = RobertaForMaskedLM(RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=66,
                                             pad_token_id=tok.pad_token_id))
    elif arch == "gpt_neox":
        m = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=64))
    elif arch == "gpt2":
        m = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=3, n_head=2, n_positions=64))
    elif arch in ("mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"):
        # rotary, grouped-query attention (2 query heads per key/value head)
        import transformers as T

        config, model = {"mistral": (T.MistralConfig, T.MistralForCausalLM), "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
                         "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM), "gemma": (T.GemmaConfig, T.GemmaForCausalLM),
                         "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM),
                         "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM)}[arch]
        kw: dict = {}
        if window is not None:
            kw = {"sliding_window": window}
            if arch in ("qwen2", "qwen3"):
                kw.update(use_sliding_window=True, max_window_layers=1)
            if arch == "gemma3_text":
                kw["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]
        m = model(config(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=8,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, **kw))
        if arch.startswith("gemma"):  # norms initialised to 0 (weight 1 + w): random, so each of them matters
            with torch.no_grad():
                for name, p in m.named_parameters():
                    if "norm" in name:
                        p.normal_(0, 0.3)
    else:
        m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64))
    return m.eval(), tok


def suite_cache() -> Path:
    """The suite's shared cache root (``CPROBE_CACHE_DIR``, as `make test` sets it)."""
    return Path(os.environ.get("CPROBE_CACHE_DIR", REPO / ".cache" / "cprobe-test"))


@pytest.fixture(scope="session")
def readme_dirs(tmp_path_factory):
    """The README's working directory and cache, one per session (``tests/study_runs.py``): its commands and its
    study runs share them."""
    from tests.study_runs import readme_dirs as make

    return make(tmp_path_factory.mktemp("readme"), suite_cache())


@pytest.fixture(scope="session")
def readme_study_runs(readme_dirs):
    """The README's study lines (one plain run per study), run once per session in the README's working directory:
    {study: StudyRun} (``tests/study_runs.py``). The README test asserts on them; ``study_runs`` reads them."""
    from tests.study_runs import SHARED_TEMPLATES, keep_seed, run_studies

    if not SHARED_TEMPLATES.exists():
        pytest.skip(f"needs {SHARED_DATA}/causalgym/templates (the shared data dir; set CPROBE_DATA_DIR)")

    runs = run_studies(readme_dirs)
    keep_seed(readme_dirs, suite_cache())
    return runs


@pytest.fixture(scope="session")
def study_runs(readme_study_runs, tmp_path_factory):
    """One finished run of every study: the README's study runs, copied under one root (``.parent``) for tests that
    write beside them: {study: run dir}."""
    from tests.study_runs import study_runs as copies

    return copies(readme_study_runs, tmp_path_factory.mktemp("study_runs"))
