"""Hardware choices: native CPU bf16 from the flags (mocked), the fp32 fallback, threads from affinity / cgroup quota /
workers / OMP_NUM_THREADS / op size, one GPU per parallel worker; and the cache kinds' one owner."""

from __future__ import annotations

import ast
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
import torch

from cprobe import compute
from cprobe.cache import KINDS, kind_dir, model_identity, unregistered
from cprobe.errors import ConfigError
from cprobe.io import atomic_save_tensors, load_tensors, read_into

AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "model name\t: Intel Xeon Platinum 8480+\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm sve\nCPU part\t: 0xd40\n"


@pytest.fixture
def flags(monkeypatch):
    def use(text):
        monkeypatch.setattr(compute, "cpu_flags", lambda cpuinfo=None: compute.__dict__["_parse"](text))
        compute._detect_cpu_bf16.cache_clear()
        compute._WARNED.clear()
    compute.__dict__["_parse"] = _real_flags
    monkeypatch.delenv("CPROBE_CPU_BF16", raising=False)
    yield use
    compute._detect_cpu_bf16.cache_clear()


_real_flags = compute.cpu_flags


@pytest.mark.parametrize(("cpuinfo", "native"), [(AVX2, False), (SAPPHIRE, True), (GRAVITON, True)])
def test_bf16_is_native_only_with_the_cpu_flags(flags, cpuinfo, native):
    flags(cpuinfo)
    assert compute.cpu_bf16() is native
    assert compute.resolve_dtype("bfloat16", "cpu") == ("bfloat16" if native else "float32")
    assert compute.resolve_dtype("bfloat16", "cuda:1") == "bfloat16"  # accelerators always
    assert compute.resolve_dtype("float32", "cpu") == "float32"


def test_the_fallback_says_so_once(flags, caplog):
    flags(AVX2)
    with caplog.at_level(logging.WARNING):
        assert not compute.use_bf16(torch.device("cpu")) and not compute.use_bf16("cpu")
    assert len([r for r in caplog.records if "no native bf16" in r.message]) == 1


def test_env_overrides_and_unknown_flags_time_a_probe(flags, monkeypatch):
    flags(AVX2)
    monkeypatch.setenv("CPROBE_CPU_BF16", "1")
    compute._detect_cpu_bf16.cache_clear()
    assert compute.cpu_bf16()
    monkeypatch.delenv("CPROBE_CPU_BF16")
    flags("")  # no flags line: a timed probe decides (and is cached)
    calls = []
    monkeypatch.setattr(compute, "_probe_bf16", lambda seconds=1.0: calls.append(1) or False)
    assert not compute.cpu_bf16() and not compute.cpu_bf16() and calls == [1]


def test_the_timed_probe_is_quick():
    import time

    t0 = time.perf_counter()
    compute._probe_bf16(seconds=0.4)
    assert time.perf_counter() - t0 < 5


def test_cpu_model_and_flags_parse():
    assert compute.cpu_model(AVX2) == "AMD EPYC 7B12" and "avx2" in compute.cpu_flags(AVX2)
    assert "bf16" in compute.cpu_flags(GRAVITON)


def test_fine_tuning_bf16_falls_back_on_a_cpu_without_it(flags):
    from cprobe.models.classifier import FinetuneConfig

    flags(AVX2)
    assert not compute.use_bf16("cpu")
    assert FinetuneConfig(precision="bf16").precision == "bf16"  # the config keeps the request; training gates it


# ----------------------------------------------------------------------------------------------- threads
def test_cgroup_quota_v2_and_v1(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert compute.cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert compute.cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert compute.cgroup_cpu_quota(tmp_path) == 4


def test_available_cpus_is_the_affinity_capped_by_the_quota(monkeypatch):
    monkeypatch.setattr(compute.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(compute, "cgroup_cpu_quota", lambda root=None: 2.5)
    assert compute.available_cpus() == 3
    monkeypatch.setattr(compute, "cgroup_cpu_quota", lambda root=None: None)
    assert compute.available_cpus() == 16


def test_threads_from_workers_and_omp():
    assert compute.choose_threads(workers=1, cpus=8, env={}) == 8
    assert compute.choose_threads(workers=2, cpus=8, env={}) == 4
    assert compute.choose_threads(workers=4, cpus=2, env={}) == 1
    assert compute.choose_threads(workers=4, cpus=2, env={"OMP_NUM_THREADS": "3"}) == 3  # the user decides


def test_fit_threads_from_the_fit_size_alone(monkeypatch):
    """A fit whose largest op is below FIT_OP_FLOPS runs on one thread, a larger one on the job's threads, whatever
    the machine's load; OMP_NUM_THREADS always wins."""
    assert compute.fit_thread_count(2 * 64 * 256 * 256, 8, env={}) == 1  # the demo's MLP probe step
    assert compute.fit_thread_count(2 * 1200 * 129**2, 8, env={}) == 1  # the reliability study's INLP Newton step
    assert compute.fit_thread_count(compute.FIT_OP_FLOPS - 1, 8, env={}) == 1
    assert compute.fit_thread_count(compute.FIT_OP_FLOPS, 8, env={}) == 8
    assert compute.fit_thread_count(2 * 20_000 * 769**2, 4, env={}) == 4  # INLP on a 768-d model's 20k states
    assert compute.fit_thread_count(2 * 64 * 256 * 256, 8, env={"OMP_NUM_THREADS": "2"}) == 2  # the user decides
    assert compute.fit_thread_count(1e12, 8, env={"OMP_NUM_THREADS": "1"}) == 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(compute.os, "getloadavg", lambda: (50.0, 50.0, 50.0), raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        with compute.fit_threads(1e6):
            seen.append(torch.get_num_threads())
        with compute.fit_threads(1e10):
            seen.append(torch.get_num_threads())
        with compute.fit_threads(1e6, torch.device("meta")):  # an accelerator's fit: nothing changes
            seen.append(torch.get_num_threads())
        assert seen == [1, 2, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_logistic_fit_runs_on_the_threads_its_size_calls_for(monkeypatch):
    from cprobe import stats

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    real = stats._fit_logistic
    monkeypatch.setattr(stats, "_fit_logistic", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
        stats.fit_logistic(X, (X[:, 0] > 0).long(), 2, 1e-2)
        monkeypatch.setattr(compute, "FIT_OP_FLOPS", 1.0)  # the same fit counted as large: the job's threads
        stats.fit_logistic(X, (X[:, 0] > 0).long(), 2, 1e-2)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2]


def test_inlp_runs_its_projections_and_fits_on_one_thread_when_small(monkeypatch):
    from cprobe.interventions import inlp

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    real = inlp.fit_logistic
    monkeypatch.setattr(inlp, "fit_logistic", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        X = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
        inlp.INLP(rank=2).fit(X, (X[:, 0] + X[:, 1] > 0).long())
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]  # each iteration's classifier fit on the projected states, inside INLP's one thread


def test_threads_context_restores():
    before = torch.get_num_threads()
    with compute.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_a_small_probe_fit_runs_on_one_thread(monkeypatch):
    from cprobe.probes.mlp import MLPProbe

    seen = []
    real = MLPProbe._train

    def spy(self, *a, **k):
        seen.append(torch.get_num_threads())
        return real(self, *a, **k)
    monkeypatch.setattr(MLPProbe, "_train", spy)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(compute, "available_cpus", lambda: 4)
    X, y = torch.randn(60, 16), torch.randint(0, 2, (60,))
    with compute.threads(4):
        MLPProbe(n_layers=(2,), widths=(256,), lrs=(1e-3,), epochs=1).fit(X, y)
        assert torch.get_num_threads() == 4
    assert seen == [1]


# ----------------------------------------------------------------------------------------------- GPUs
def test_each_parallel_worker_claims_its_own_gpu(tmp_path):
    if (f := compute._CLAIM.pop("file", None)) is not None:  # a claim an earlier test left (a worker's ends with it)
        f.close()
    compute._CLAIM.clear()
    held = []
    try:
        assert compute.worker_device("cuda", workers=2, n_gpus=2, lock_dir=tmp_path) == "cuda:0"
        assert compute.worker_device("auto", workers=2, n_gpus=2, lock_dir=tmp_path) == "cuda:0"  # held for life
        held.append(compute._CLAIM.pop("file"))  # another worker process: its own claim (the first lock stays held)
        compute._CLAIM.clear()
        assert compute.claim_gpu(2, tmp_path) == 1
        held.append(compute._CLAIM.pop("file"))
        compute._CLAIM.clear()
        assert compute.claim_gpu(2, tmp_path) is None  # all held: the caller shares by job number
        assert compute.worker_device("cuda", workers=3, job_num=5, n_gpus=2, lock_dir=tmp_path) == "cuda:1"
    finally:
        compute._CLAIM.clear()
        for f in held:
            f.close()
    assert compute.worker_device("cuda", workers=1, n_gpus=4) == "cuda"  # one worker: as configured
    assert compute.worker_device("cuda:2", workers=4, n_gpus=4) == "cuda:2"
    assert compute.worker_device("cpu", workers=4, n_gpus=4) == "cpu"
    assert compute.worker_device("auto", workers=4, n_gpus=1) == "auto"


def test_a_device_index_beyond_the_visible_gpus_is_a_config_error(monkeypatch):
    from cprobe.models.load import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


# ----------------------------------------------------------------------------------------------- cache kinds
def test_an_unregistered_kind_is_refused():
    with pytest.raises(ConfigError, match="unknown cache kind 'tmp'"):
        kind_dir(Path("/c"), "tmp")
    assert kind_dir(Path("/c"), "cloze") == Path("/c/cloze")


SRC = Path(__file__).resolve().parents[2] / "src" / "cprobe"


def test_every_cache_directory_the_code_names_is_a_registered_kind():
    """`<anything named *cache_root*> / "<literal>"` anywhere in the package must be a registered kind."""
    bad = []
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
                left = ast.unparse(node.left)
                if "cache_root" in left and not left.startswith("kind_dir(") and node.right.value not in KINDS:
                    bad.append(f"{f.relative_to(SRC)}:{node.lineno}: {left} / {node.right.value!r}")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("kind_dir") and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value not in KINDS:
                bad.append(f"{f.relative_to(SRC)}:{node.lineno}: kind_dir(..., {node.args[1].value!r})")
    assert not bad, bad


def test_a_copied_checkpoint_has_the_same_identity(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"model_type": "bert"}')
    atomic_save_tensors(a / "model.safetensors", {"w": torch.arange(4.0)})
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    ident = model_identity({"name": "m", "path": str(a), "kind": "mlm"})
    assert ident == model_identity({"name": "m", "path": str(b), "kind": "mlm"})
    assert str(tmp_path) not in json.dumps(ident)
    atomic_save_tensors(b / "model.safetensors", {"w": torch.arange(4.0) + 1})
    assert model_identity({"name": "m", "path": str(b), "kind": "mlm"}) != ident
    hub = model_identity({"name": "p", "path": "EleutherAI/pythia-70m", "kind": "causal", "revision": "step1"})
    assert hub["path"] == "EleutherAI/pythia-70m" and hub["revision"] == "step1"


def test_unregistered_lists_strays(tmp_path):
    (tmp_path / "activations").mkdir()
    (tmp_path / "scratch").mkdir()
    assert unregistered(tmp_path) == ["scratch"]


def test_files_from_earlier_versions_sha256_still_verify(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    t = torch.arange(6.0).reshape(2, 3)
    digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    save_file({"t": t}, tmp_path / "old.safetensors", metadata={"cprobe.sha256": json.dumps({"t": digest})})
    assert torch.equal(load_tensors(tmp_path / "old.safetensors")["t"], t)
    out = torch.empty(2, 3)
    assert read_into(tmp_path / "old.safetensors", "t", out) and torch.equal(out, t)
    assert not read_into(tmp_path / "old.safetensors", "t", torch.empty(3, 2))  # wrong shape: not read


def test_our_files_load_with_the_safetensors_library(tmp_path):
    from safetensors.torch import load_file

    ts = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int8), "c": torch.randn(2).bfloat16()}
    atomic_save_tensors(tmp_path / "x.safetensors", ts)
    back = load_file(tmp_path / "x.safetensors")
    assert all(torch.equal(back[k], v) for k, v in ts.items())


@pytest.mark.parametrize(("overrides", "rows", "tokens"), [
    (["compute=cpu"], 128, None), (["compute=gpu"], 512, 32768), (["compute=gpu_bf16"], 512, 65536),
    (["compute=gpu", "model.batch_size=8"], 8, 32768), (["compute=auto", "model=minilm_l6"], 64, None)])
def test_the_compute_group_sizes_batches_and_the_model_config_still_wins(overrides, rows, tokens):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import cprobe.pipeline  # noqa: F401  (registers the config's resolvers)
    from cprobe.models.load import parse_model_config

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    mc = parse_model_config(cfg["model"])
    assert (mc.batch_size, mc.batch_tokens) == (rows, tokens)


def _hand_built_cache_paths() -> list[str]:
    """Every ``<root> / ...`` or ``os.path.join(<root>, ...)`` whose root is the cache root itself (a name holding
    ``cache_root``, ``CPROBE_CACHE_DIR`` or a ``cache_dir()`` call) rather than ``kind_dir(root, kind)``."""
    def is_root(node: ast.AST) -> bool:
        text = ast.unparse(node)
        return not text.startswith(("kind_dir(", "cache.kind_dir(")) and (
            "cache_root" in text or "CPROBE_CACHE_DIR" in text or text.endswith("cache_dir()"))

    bad = []
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and is_root(node.left):
                bad.append(f"{f.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("path.join") and node.args \
                    and is_root(node.args[0]):
                bad.append(f"{f.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_every_path_under_the_cache_root_goes_through_kind_dir():
    """No cache path is built by hand: ``cache_root / "models"`` (even a registered kind) must be
    ``kind_dir(cache_root, "models")``, so the registry names every directory the code writes."""
    assert _hand_built_cache_paths() == []


def test_the_cache_path_check_catches_a_hand_built_path(tmp_path, monkeypatch):
    """The check above can fail: a module with ``Path(cache_root) / "models"`` is named."""
    pkg = tmp_path / "cprobe"
    pkg.mkdir()
    (pkg / "m.py").write_text("from pathlib import Path\n\ndef f(cache_root):\n    return Path(cache_root) / 'models'\n"
                              "\ndef g(cache_root):\n    return kind_dir(cache_root, 'models') / 'x'\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    assert _hand_built_cache_paths() == ["m.py:4: Path(cache_root) / 'models'"]
