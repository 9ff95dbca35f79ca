"""Models across devices (``model.device_map``, Hugging Face accelerate), on the CPU: a tiny masked and a tiny causal
model split between ``cpu`` and ``disk`` (an explicit map, and ``auto`` under a memory cap) give the unsplit model's
states at every layer, scores, edited outputs (interchange, replace, a live eraser) and DAS gradients (<= 1e-5), and
the same weights fingerprint (so caches are shared); every bad setting is one line before any weights load."""

from __future__ import annotations

import pytest
import torch

from cprobe.directions.das import DAS
from cprobe.errors import ConfigError
from cprobe.interventions.leace import LEACE
from cprobe.models import placement
from cprobe.models.edits import Apply, Interchange, Replace, dii_edit
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.load import fingerprint, load_adapter, parse_model_config
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from tests.conftest import make_random_model
from tests.unit.test_engine import _examples

pytest.importorskip("accelerate")
TOL = dict(atol=1e-5, rtol=1e-5)
KIND = {"bert": "mlm", "gpt2": "causal"}
# half the blocks (and GPT-2's final norm) on disk, the rest in host memory
SPLIT = {
    "bert": {"bert.embeddings": "cpu", "bert.encoder.layer.0": "cpu", "bert.encoder.layer.1": "disk",
             "bert.encoder.layer.2": "disk", "cls": "cpu"},  # the LM head is tied to the embeddings
    "gpt2": {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu", "transformer.h.0": "cpu",
             "transformer.h.1": "disk", "transformer.h.2": "disk", "transformer.ln_f": "disk", "lm_head": "cpu"},
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each tiny model saved as a checkpoint dir (safetensors + tokenizer), loaded through load_adapter."""
    out = {}
    for arch in KIND:
        model, tok = make_random_model(arch)
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = d
    return out


def _cfg(path, arch, **kw):
    return {"name": arch, "source": "hub", "path": str(path), "kind": KIND[arch], "device": "cpu", "batch_size": 8,
            **kw}


def _adapters(saved, arch, tmp_path):
    one = load_adapter(_cfg(saved[arch], arch), tmp_path)
    split = load_adapter(_cfg(saved[arch], arch, device_map=SPLIT[arch], offload_dir=str(tmp_path / "off")),
                         tmp_path)
    auto = load_adapter(_cfg(saved[arch], arch, device_map="auto", max_memory={"cpu": "30KB"},
                             offload_dir=str(tmp_path / "off_auto")), tmp_path)
    return one, split, auto


@pytest.mark.parametrize("arch", list(KIND))
def test_a_cpu_disk_split_gives_the_unsplit_states_scores_and_edits(arch, saved, tmp_path):
    one, split, auto = _adapters(saved, arch, tmp_path)
    assert set(split.model.hf_device_map.values()) == {"cpu", "disk"} and placement.offloaded(split.model)
    assert "disk" in auto.model.hf_device_map.values() and not placement.dispatched(one.model)
    assert split.device == torch.device("cpu") and split.limit_key() != one.limit_key()
    ex = _examples(24)
    fmt = AgreementFormatter()
    cands = CandidateTokens([[one.candidate_id(e.correct), one.candidate_id(e.wrong)] for e in ex])
    sites = [Site(layer) for layer in range(one.n_layers + 1)]
    mid, top = Site(2), Site(one.n_layers)
    src = one.map(list(reversed(ex)), fmt, read=[mid, top]).acts
    a = torch.nn.functional.normalize(torch.randn(one.hidden_size, generator=torch.Generator().manual_seed(0)), dim=0)
    z = torch.arange(len(ex)) % 2
    eraser = LEACE().fit(src[mid], z)
    edits = {"interchange": {mid: Interchange(src[mid], a)}, "replace": {Site(1): Replace(src[mid])},
             "eraser": {mid: Apply(eraser)}, "last layer": {top: Interchange(src[top])},
             "head only": {top: Replace(src[top])}}  # scored by the LM head alone (the model is skipped)
    ref_reads = one.map(ex, fmt, read=sites)  # no readout: the pass stops after the deepest read
    ref = one.map(ex, fmt, read=sites, readout=cands)
    ref_edited = {k: one.map(ex, fmt, read=[] if k == "head only" else [top], edits=e, readout=cands)
                  for k, e in edits.items()}
    for other in (split, auto):
        reads = other.map(ex, fmt, read=sites)
        out = other.map(ex, fmt, read=sites, readout=cands)
        for s in sites:
            torch.testing.assert_close(reads.acts[s], ref_reads.acts[s], **TOL)
            torch.testing.assert_close(out.acts[s], ref.acts[s], **TOL)
        torch.testing.assert_close(out.scores, ref.scores, **TOL)
        for k, e in edits.items():
            got = other.map(ex, fmt, read=[] if k == "head only" else [top], edits=e, readout=cands)
            torch.testing.assert_close(got.scores, ref_edited[k].scores, **TOL, msg=k)
            if k != "head only":
                torch.testing.assert_close(got.acts[top], ref_edited[k].acts[top], **TOL, msg=k)
        assert not torch.equal(ref_edited["interchange"].scores, ref.scores)  # the edits change something
    assert fingerprint(split) == fingerprint(auto) == fingerprint(one)  # offloaded weights read back: one cache key


@pytest.mark.parametrize("arch", list(KIND))
def test_das_trains_through_a_split_model_as_through_the_unsplit_one(arch, saved, tmp_path):
    one, split, _ = _adapters(saved, arch, tmp_path)
    ex = _examples(16)
    fmt = AgreementFormatter()
    site = Site(2)  # a block on disk
    cands = CandidateTokens([[one.candidate_id(e.correct), one.candidate_id(e.wrong)] for e in ex])
    src = one.map(list(reversed(ex)), fmt, read=[site]).acts[site]
    target = torch.ones(len(ex), dtype=torch.long)
    directions = []
    for adapter in (one, split):
        batch = fmt(ex, adapter, torch.arange(len(ex)))

        def forward(edit, idx, adapter=adapter, batch=batch):
            return adapter.run(batch.select(idx), edits={site: edit}, readout=cands, grad=True).scores

        das = DAS(seed=0, batch_size=8, epochs=1).fit(forward, src, target)
        directions.append((das.a.detach().clone(), torch.tensor(das.losses)))
        a = torch.nn.Parameter(torch.nn.functional.normalize(torch.ones(one.hidden_size), dim=0))
        scores = adapter.run(batch, edits={site: dii_edit(src, a)}, readout=cands, grad=True).scores
        scores.log_softmax(-1)[:, 1].sum().backward()
        directions.append((a.grad.clone(), scores.detach()))
    for x, y in zip(directions[0] + directions[1], directions[2] + directions[3]):
        torch.testing.assert_close(x, y, **TOL)


def test_an_offloaded_model_is_not_fine_tuned(saved, tmp_path):
    from cprobe.models.classifier import wrap

    split = load_adapter(_cfg(saved["bert"], "bert", kind="encoder", device_map={"embeddings": "cpu",
                                                                                "encoder": "disk", "pooler": "cpu"},
                              offload_dir=str(tmp_path / "off")), tmp_path)
    with pytest.raises(ConfigError, match="fine-tuning a classifier needs every weight"):
        wrap(split, 2)


# ----------------------------------------------------------------------------------------------- bad settings
@pytest.mark.parametrize(("extra", "match"), [
    ({"device_map": "everywhere"}, r"unknown model.device_map 'everywhere'; choose from \['auto'"),
    ({"device_map": {"bert": "tpu"}}, r"model.device_map.bert='tpu' is not a device; choose from"),
    ({"device_map": {"bert": "disk"}}, "on disk but model.offload_dir is not set"),
    ({"device_map": {}}, "empty mapping"),
    ({"max_memory": {"cpu": "1GiB"}}, "model.max_memory is set but model.device_map is null"),
    ({"offload_dir": "/tmp/x"}, "model.offload_dir is set but model.device_map is null"),
    ({"device_map": "auto", "max_memory": {"cpu": "lots"}}, "is not a size"),
    ({"device_map": {"": "cpu"}, "max_memory": {"cpu": "1GiB"}}, "with an explicit model.device_map"),
    ({"device_map": 3}, "must be a string or a mapping or null"),
])
def test_bad_placement_settings_are_one_line_when_parsed(extra, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_model_config({"name": "m", "path": "x", **extra})
    assert "\n" not in str(e.value)


def test_the_job_device_and_the_machine_bound_the_map(monkeypatch):
    gpu_map = parse_model_config({"name": "m", "path": "x", "device_map": {"encoder": 0, "": "cpu"}})
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[0\] but the job computes on the CPU"):
        placement.check_placement_for(gpu_map, "cpu")
    capped = parse_model_config({"name": "m", "path": "x", "device_map": "auto", "max_memory": {1: "2GiB"}})
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[1\] but device=cuda:0"):
        placement.check_placement_for(capped, "cuda:0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is available"):
            placement.check_placement_for(parse_model_config({"name": "m", "path": "x", "device_map": "auto"}), "cuda")
        with pytest.raises(ConfigError, match=r"names GPU\(s\) \[0\] but 0 CUDA device"):
            placement.check_placement_for(gpu_map, "auto")
    placement.check_placement_for(parse_model_config({"name": "m", "path": "x", "device_map": "auto"}), "cpu")
    monkeypatch.setattr(placement, "accelerate_available", lambda: False)
    with pytest.raises(ConfigError, match=r"install it with `pip install 'cprobe\[scale\]'`"):
        placement.check_placement_for(gpu_map, "cpu")


def test_module_names_and_disk_spill_are_checked_before_weights_load(saved, tmp_path, monkeypatch):
    import transformers

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    path = saved["gpt2"]
    with pytest.raises(ConfigError, match=r"unknown module\(s\) \['transformer.blocks.0'\].*top modules are"):
        load_adapter(_cfg(path, "gpt2", device_map={"transformer.blocks.0": "cpu", "": "cpu"}), tmp_path)
    with pytest.raises(ConfigError, match=r"does not place \d+ weight\(s\).*transformer.h"):
        load_adapter(_cfg(path, "gpt2", device_map={"transformer.wte": "cpu", "lm_head": "cpu"}), tmp_path)
    with pytest.raises(ConfigError, match=r"tied weights transformer.wte.weight \(cpu\) and lm_head.weight \(disk\)"):
        load_adapter(_cfg(path, "gpt2", device_map={"transformer": "cpu", "lm_head": "disk"}, offload_dir="x"),
                     tmp_path)
    with pytest.raises(ConfigError, match="would be offloaded to disk; set model.offload_dir"):
        load_adapter(_cfg(path, "gpt2", device_map="auto", max_memory={"cpu": "30KB"}), tmp_path)


def test_cli_overrides_are_validated_before_the_run(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe.pipeline import prepare
    from tests.conftest import REPO

    for overrides, match in [(["model.device_map=bogus"], "unknown model.device_map 'bogus'"),
                             (["compute=cpu", "model.device_map={bert.embeddings: cpu, bert.encoder: 0, cls: cpu}"],
                              "the job computes on the CPU"),
                             (["model.device_map={bert.embeddings: cpu, bert.encoder: disk, cls: cpu}"],
                              "model.offload_dir is not set")]:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["+experiment=sva_tiny", f"paths.cache_dir={tmp_path}", *overrides])
        plain = OmegaConf.to_container(cfg, resolve=True)
        plain.pop("paths", None)
        with pytest.raises(ConfigError, match=match):
            prepare(plain)
