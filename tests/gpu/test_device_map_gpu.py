"""Device maps on GPUs (``pytest -m gpu``): a model split across two GPUs, and one GPU with part of the model offloaded
to host memory and disk, give the single-GPU model's states, scores and edited outputs; skipped without CUDA (and the
two-GPU test with fewer than two)."""

from __future__ import annotations

import pytest
import torch

from cprobe.models.edits import Interchange
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.load import load_adapter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from tests.conftest import make_random_model
from tests.unit.test_engine import _examples

pytest.importorskip("accelerate")
pytestmark = pytest.mark.gpu
TOL = dict(atol=1e-4, rtol=1e-4)  # float32 on different GPUs / kernels
MAPS = {
    "two GPUs": {"transformer.wte": 0, "transformer.wpe": 0, "transformer.drop": 0, "transformer.h.0": 0,
                 "transformer.h.1": 1, "transformer.h.2": 1, "transformer.ln_f": 1, "lm_head": 0},
    "GPU, host and disk": {"transformer.wte": 0, "transformer.wpe": 0, "transformer.drop": 0, "transformer.h.0": 0,
                           "transformer.h.1": "cpu", "transformer.h.2": "disk", "transformer.ln_f": 0, "lm_head": 0},
}


@pytest.mark.parametrize("name", list(MAPS))
def test_a_gpu_split_gives_the_single_gpu_states_and_edits(name, tmp_path):
    if name == "two GPUs" and torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    model, tok = make_random_model("gpt2")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = {"name": "gpt2", "source": "hub", "path": str(tmp_path / "m"), "kind": "causal", "batch_size": 16}
    one = load_adapter({**cfg, "device": "cuda:0"}, tmp_path)
    split = load_adapter({**cfg, "device": "cuda", "device_map": MAPS[name], "offload_dir": str(tmp_path / "off")},
                         tmp_path)
    assert split.device == torch.device("cuda:0")
    ex = _examples(48)
    fmt = AgreementFormatter()
    cands = CandidateTokens([[one.candidate_id(e.correct), one.candidate_id(e.wrong)] for e in ex])
    sites = [Site(layer) for layer in range(one.n_layers + 1)]
    src = one.map(list(reversed(ex)), fmt, read=[Site(2)]).acts[Site(2)]
    a = torch.nn.functional.normalize(torch.randn(one.hidden_size), dim=0)
    for edits in ({}, {Site(2): Interchange(src, a)}):
        x = one.map(ex, fmt, read=sites, edits=edits, readout=cands)
        y = split.map(ex, fmt, read=sites, edits=edits, readout=cands)
        for s in sites:
            torch.testing.assert_close(y.acts[s], x.acts[s], **TOL)
        torch.testing.assert_close(y.scores, x.scores, **TOL)
