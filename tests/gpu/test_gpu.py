"""The engine on a CUDA device: the same states as on the CPU (float32, within 1e-4), the bf16 path (cosine ≥ 0.99
to float32), pinned prefetch and one-copy reads equal to the plain path, OOM back-off (injected and real), sharded
extraction, a second GPU, and DAS trained through the model on the GPU. Run with ``pytest -m gpu``."""

from __future__ import annotations

import pytest
import torch

from cprobe.cache import ActivationCache
from cprobe.directions.das import DAS
from cprobe.extract import extract_sites
from cprobe.models import batching
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import dii_edit
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from tests.conftest import make_random_model
from tests.unit.test_engine import _examples, _inject_oom

pytestmark = pytest.mark.gpu
ATOL = RTOL = 1e-4  # float32 on GPU vs CPU: different kernels (SDPA, GEMM blocking), no TF32


def _pair(arch, **kw):
    model, tok = make_random_model(arch)
    kind = "mlm" if arch == "bert" else "causal"
    cpu = ModelAdapter(model, tok, kind, arch, **kw)
    model2, _ = make_random_model(arch)
    gpu = ModelAdapter(model2.cuda(), tok, kind, arch, **kw)
    return cpu, gpu


@pytest.mark.parametrize("arch", ["bert", "gpt_neox", "gpt2", "llama"])
def test_gpu_states_and_scores_equal_the_cpu(arch):
    ex = _examples(64)
    cpu, gpu = _pair(arch, batch_size=16)
    cands = CandidateTokens([[cpu.candidate_id(e.correct), cpu.candidate_id(e.wrong)] for e in ex])
    sites = [Site(layer) for layer in range(cpu.n_layers + 1)]
    a = cpu.map(ex, AgreementFormatter(), read=sites, readout=cands)
    b = gpu.map(ex, AgreementFormatter(), read=sites, readout=cands)
    assert b.acts[sites[0]].device.type == "cpu"
    for s in sites:
        torch.testing.assert_close(b.acts[s], a.acts[s], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(b.scores, a.scores, atol=ATOL, rtol=RTOL)


def test_bf16_model_and_storage_stay_close_to_float32():
    ex = _examples(64)
    cpu, gpu = _pair("gpt_neox", batch_size=16)
    gpu.model.to(torch.bfloat16)
    site = Site(2)
    a = cpu.map(ex, AgreementFormatter(), read=[site]).acts[site]
    b = gpu.map(ex, AgreementFormatter(), read=[site], dtype=torch.bfloat16).acts[site]
    assert b.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(a, b.float(), dim=1)
    assert float(cos.min()) > 0.99


def test_pinned_prefetch_and_one_copy_reads_change_nothing():
    ex = _examples(80)
    _, gpu = _pair("bert", batch_size=8, batch_tokens=64)
    sites = [Site(1), Site(3)]
    gpu.prefetch = False
    plain = gpu.map(ex, AgreementFormatter(), read=sites)
    gpu.prefetch = True
    fast = gpu.map(ex, AgreementFormatter(), read=sites)
    for s in sites:
        assert torch.equal(plain.acts[s], fast.acts[s])


def test_injected_oom_backs_off_on_the_gpu(tmp_path):
    batching._LIMITS.clear()
    ex = _examples(48)
    _, ref = _pair("bert", batch_size=48)
    want = ref.map(ex, AgreementFormatter(), read=[Site(2)]).acts[Site(2)]
    _, gpu = _pair("bert", batch_size=48, limits=batching.BatchLimits(tmp_path / "limits.json"))
    calls = []
    _inject_oom(gpu, 100, calls)
    got = gpu.map(ex, AgreementFormatter(), read=[Site(2)]).acts[Site(2)]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert gpu.token_cap() <= 100 and "cuda:" in gpu.limit_key()
    batching._LIMITS.clear()


def test_a_real_oom_backs_off():
    """A memory cap on this process makes a large batch fail for real; the engine halves it until it fits."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from cprobe.data.items import TextItem
    from cprobe.models.formatters import ClassificationFormatter

    batching._LIMITS.clear()
    _, tok = make_random_model("gpt_neox")
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(tok), hidden_size=1024, num_hidden_layers=4,
                                             num_attention_heads=8, intermediate_size=4096,
                                             max_position_embeddings=512)).cuda().eval()
    ad = ModelAdapter(model, tok, "causal", "big", batch_size=4096, max_length=512)
    items = [TextItem(str(i), " ".join(["the author"] * 200)) for i in range(1024)]
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_allocated() + 2 * 2**30) / total))
    try:
        out = ad.map(items, ClassificationFormatter(), read=[Site(2, "last")])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert out.acts[Site(2, "last")].shape == (1024, 1024)
    assert ad.token_cap() is not None  # it did run out, and remembered the size that fits
    one = ad.map(items[:4], ClassificationFormatter(), read=[Site(2, "last")]).acts[Site(2, "last")]
    torch.testing.assert_close(out.acts[Site(2, "last")][:4], one, atol=ATOL, rtol=RTOL)
    batching._LIMITS.clear()


def test_sharded_extraction_on_the_gpu_equals_map(tmp_path):
    ex = _examples(50)
    _, gpu = _pair("gpt2", batch_size=8)
    cache = ActivationCache(tmp_path, shard_mb=32 * 4 * 10 / 2**20)
    acts, _, _ = extract_sites(gpu, ex, "fp", "d", AgreementFormatter(), [Site(2)], None, cache, progress=False)
    ref = gpu.map(ex, AgreementFormatter(), read=[Site(2)]).acts[Site(2)]
    torch.testing.assert_close(acts[Site(2)], ref, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_second_gpu_by_index():
    from cprobe.models.load import resolve_device

    ex = _examples(16)
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model.to(resolve_device("cuda:1")), tok, "mlm", "bert")
    out = ad.map(ex, AgreementFormatter(), read=[Site(1)])
    assert ad.device == torch.device("cuda:1") and out.acts[Site(1)].shape == (16, 32)


def test_das_trains_through_the_model_on_the_gpu():
    """DAS through the directions API, the forward being the model on the GPU (the interchange at layer 2)."""
    ex = _examples(32)
    _, gpu = _pair("gpt_neox", batch_size=32)
    fmt = AgreementFormatter()
    site = Site(2)
    batch = fmt(ex, gpu, torch.arange(len(ex))).to("cuda")
    src = gpu.map(list(reversed(ex)), fmt, read=[site]).acts[site].cuda()
    cands = CandidateTokens([[gpu.candidate_id(e.correct), gpu.candidate_id(e.wrong)] for e in ex])
    target = torch.zeros(len(ex), dtype=torch.long, device="cuda")

    def forward(edit, idx):
        sub = batch.select(idx.cuda())
        return gpu.run(sub, edits={site: edit}, readout=cands, grad=True).scores

    das = DAS(seed=0, batch_size=8, epochs=2).fit(forward, src, target)
    assert das.a.device.type == "cuda" and float(das.a.norm()) == pytest.approx(1.0, abs=1e-5)
    assert len(das.losses) == 8 and all(torch.isfinite(torch.tensor(das.losses)))
    assert callable(dii_edit)
