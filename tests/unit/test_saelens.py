"""SAELens both ways (cprobe.sae.saelens, cprobe.sae.method's site checks): the folders SAELens itself wrote
(tests/data/saelens, README there) read as SAELens computes them; SAELens's cfg.json keys pinned on hand-made cases in
both of its formats; the ``rescale_acts_by_decoder_norm`` fold by hand; what cprobe writes; the layer, model and hook
of every site a study reads. The round trips through SAELens itself run where ``sae_lens`` is installed."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from cprobe.sae import saelens
from cprobe.sae.dictionary import SAE
from cprobe.sae.method import at_site, check_sites, loads_sae
from cprobe.sae.train import TrainSettings, minibatches, train

DATA = Path(__file__).resolve().parents[1] / "data" / "saelens"
READ = ["standard", "topk", "topk_rescale", "topk_trained", "jumprelu", "mlp_out", "layers/layer_3", "layers/layer_4"]
# float32 on another CPU: the same sums in another order differ by a few ulp of values of order 1-10; the fold of
# rescale_acts_by_decoder_norm adds one rounding per weight (measured 1.4e-6 here)
ATOL = 1e-5

# SAELens 6's SAEConfig.to_dict() keys (sae_lens/saes/sae.py, topk_sae.py; SAELens 6.54.12), in its order
KEYS = ["d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations", "reshape_activations",
        "metadata"]
KEYS_OF = {"standard": [*KEYS, "architecture"], "jumprelu": [*KEYS, "architecture"],
           "topk": [*KEYS, "k", "rescale_acts_by_decoder_norm", "architecture"]}


def expected() -> dict[str, torch.Tensor]:
    return load_file(str(DATA / "expected.safetensors"))


def write(folder: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / saelens.WEIGHTS))
    (folder / saelens.CFG).write_text(json.dumps(cfg))
    return folder


def weights(d_in: int = 2, d_sae: int = 3, **extra: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"W_enc": torch.randn(d_in, d_sae, generator=g), "b_enc": torch.zeros(d_sae),
            "W_dec": torch.randn(d_sae, d_in, generator=g), "b_dec": torch.zeros(d_in), **extra}


def no_nulls(obj) -> bool:
    if isinstance(obj, dict):
        return all(v is not None and no_nulls(v) for v in obj.values())
    return obj is not None


# ------------------------------------------------------------------------------ SAELens's own files
@pytest.mark.parametrize("name", READ)
def test_saelens_folders_read_as_saelens_computes_them(name):
    E = expected()
    sae = saelens.load(DATA / name)
    f = sae.encode(E["x"])
    want = E[f"{name.replace('/', '.')}.encode"]
    assert torch.equal(f != 0, want != 0)  # the same active latents (the inputs are clear of ties)
    torch.testing.assert_close(f, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(sae.decode(f), E[f"{name.replace('/', '.')}.decode"], atol=ATOL, rtol=0)


def test_what_cprobe_reads_from_saelens_files():
    got = {n: saelens.read_cfg(DATA / n) for n in READ}
    assert {n: (c["activation"], c["k"], c["rescale"]) for n, c in got.items() if "/" not in n} == {
        "standard": ("relu", None, False), "topk": ("topk", 4, False), "topk_rescale": ("topk", 4, True),
        "topk_trained": ("topk", 4, True),  # SAELens's training save: norms folded in, the flag left true
        "jumprelu": ("jumprelu", None, False), "mlp_out": ("relu", None, False)}
    assert {c["model_name"] for c in got.values()} == {"tiny_bert_sva"}
    assert got["layers/layer_4"]["hook_name"] == "blocks.4.hook_resid_pre" and not got["jumprelu"][
        "apply_b_dec_to_input"]
    for n in ("standard", "topk", "jumprelu"):  # SAELens's save_model writes exactly the pinned keys
        assert list(json.loads((DATA / n / saelens.CFG).read_text())) == KEYS_OF[got[n]["architecture"]]


def test_rescale_by_decoder_norm_is_applied():
    """Read without the flag, the rescaled TopK picks other latents: the fold is what makes it SAELens's SAE."""
    E, cfg = expected(), saelens.read_cfg(DATA / "topk_rescale")
    raw = load_file(str(DATA / "topk_rescale" / saelens.WEIGHTS))
    unfolded = SAE(**raw, activation="topk", k=cfg["k"])
    assert not torch.equal(unfolded.encode(E["x"]) != 0, E["topk_rescale.encode"] != 0)


def test_the_fold_by_hand():
    # W_dec rows of norms 2 and 0.5; pre = (1, 3) → rescaled (2, 1.5): TopK(1) keeps latent 0 at 2, not latent 1 at 3
    W_enc, b_enc, W_dec = torch.tensor([[1.0, 3.0]]), torch.zeros(2), torch.tensor([[2.0], [0.5]])
    W_enc2, b_enc2, W_dec2 = saelens.fold_decoder_norms(W_enc, b_enc, W_dec)
    assert torch.equal(W_enc2, torch.tensor([[2.0, 1.5]])) and torch.equal(W_dec2, torch.tensor([[1.0], [1.0]]))
    sae = SAE(W_enc=W_enc2, b_enc=b_enc2, W_dec=W_dec2, b_dec=torch.zeros(1), activation="topk", k=1)
    x = torch.tensor([[1.0]])
    assert torch.equal(sae.encode(x), torch.tensor([[2.0, 0.0]]))
    assert torch.equal(sae.decode(sae.encode(x)), torch.tensor([[2.0]]))  # (f / n) W_dec = (2 / 2) · 2


def test_saelens_folders_cprobe_refuses_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="architecture 'gated' is not supported") as e:
        saelens.load(DATA / "gated")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="hook 'blocks.2.hook_mlp_out'.*not at layer 3"):
        check_sites(INTERVENTIONS.get("sae_latents"), {"path": str(DATA / "mlp_out")}, [3])


# ------------------------------------------------------------------------------ SAELens's cfg keys, by hand
V6 = {"sae_lens_version": "6.54.12"}


@pytest.mark.parametrize(("cfg", "want"), [
    # SAELens 6: the architecture alone picks the SAE (an activation_fn key is not a field: ignored)
    ({"architecture": "standard", "activation_fn": "topk", "k": 1, "metadata": {**V6, "model_name": "m",
                                                                                "hook_name": "blocks.1.hook_resid_pre"}},
     ("relu", None, False, "m", "blocks.1.hook_resid_pre")),
    ({"architecture": "topk", "k": 2, "rescale_acts_by_decoder_norm": True, "metadata": V6},
     ("topk", 2, True, None, None)),
    ({"architecture": "jumprelu", "rescale_acts_by_decoder_norm": True, "metadata": V6},  # not a JumpReLU field
     ("jumprelu", None, False, None, None)),
    # older formats: hook_point, activation_fn_str, names at the top level; topk + activation_fn_kwargs.k = TopK,
    # whose k wins over a top-level one (SAELens's handle_pre_6_0_config)
    ({"hook_point": "blocks.3.hook_resid_post", "model_name": "gpt2-small", "activation_fn_str": "topk",
      "activation_fn_kwargs": {"k": 2}, "k": 3}, ("topk", 2, False, "gpt2-small", "blocks.3.hook_resid_post")),
    ({"architecture": "topk", "k": 1, "hook_name": "blocks.0.hook_resid_pre"}, ("topk", 1, False, None,
                                                                                 "blocks.0.hook_resid_pre")),
    ({"normalize_activations": False}, ("relu", None, False, None, None)),
    # cprobe's own folders before SAELens 6's format (null names) still read
    ({"architecture": "standard", "activation_fn_str": "relu", "model_name": None, "hook_name": None},
     ("relu", None, False, None, None)),
])
def test_saelens_cfg_keys(tmp_path, cfg, want):
    folder = write(tmp_path, {"d_in": 2, "d_sae": 3, **cfg}, weights(threshold=torch.zeros(3)) if
                   cfg.get("architecture") == "jumprelu" else weights())
    got = saelens.read_cfg(folder)
    assert (got["activation"], got["k"], got["rescale"], got["model_name"], got["hook_name"]) == want
    assert saelens.load(folder).activation == want[0]


@pytest.mark.parametrize(("cfg", "extra", "message"), [
    ({"architecture": "topk", "metadata": V6}, {}, "TopK SAE needs an integer k >= 1"),
    ({"metadata": V6}, {}, "lacks `architecture`"),
    ({"architecture": "abstopk", "k": 1, "metadata": V6}, {}, "architecture 'abstopk' is not supported"),
    ({"activation_fn_str": "tanh-relu"}, {}, "activation 'tanh-relu'"),
    ({"activation_fn_str": "topk"}, {}, "activation 'topk' with architecture 'standard'"),  # topk without its k
    ({"normalize_activations": True}, {}, "normalize_activations='expected_average_only_in'"),
    ({"architecture": "standard", "reshape_activations": "hook_z", "metadata": V6}, {}, "attention-head SAE"),
    ({"hook_point_head_index": 3}, {}, "attention-head SAE"),
    ({}, {"threshold": torch.zeros(3)}, r"holds \['threshold'\], which a standard SAE does not have"),
    ({}, {"scaling_factor": torch.full((3,), 2.0)}, "scaling_factor other than 1"),
    ({"architecture": "jumprelu", "metadata": V6}, {}, r"lacks \['threshold'\]"),
])
def test_saelens_cfgs_cprobe_refuses(tmp_path, cfg, extra, message):
    write(tmp_path, {"d_in": 2, "d_sae": 3, **cfg}, weights(**extra))
    with pytest.raises(ConfigError, match=message) as e:
        saelens.load(tmp_path)
    assert "\n" not in str(e.value)


def test_a_scaling_factor_of_ones_is_dropped_as_saelens_does(tmp_path):
    write(tmp_path, {"d_in": 2, "d_sae": 3}, weights(scaling_factor=torch.ones(3)))
    assert saelens.load(tmp_path).d_sae == 3


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
def test_cprobe_writes_saelens_6_keys_and_no_null(tmp_path, activation):
    w = weights()
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], activation=activation,
              k=2 if activation == "topk" else None, threshold=torch.ones(3) if activation == "jumprelu" else None)
    saelens.save(sae, tmp_path)
    cfg = json.loads((tmp_path / saelens.CFG).read_text())
    assert list(cfg) == KEYS_OF[cfg["architecture"]] and no_nulls(cfg)
    assert cfg["metadata"] == {"sae_lens_version": saelens.FORMAT_VERSION}  # no names known: none written
    sae.model_name, sae.hook_name = "tiny_bert_sva", saelens.layer_hook(3)
    saelens.save(sae, tmp_path)
    cfg = json.loads((tmp_path / saelens.CFG).read_text())
    assert cfg["metadata"] == {"sae_lens_version": saelens.FORMAT_VERSION, "model_name": "tiny_bert_sva",
                               "hook_name": "blocks.2.hook_resid_post"}
    back = saelens.load(tmp_path)
    assert (back.activation, back.k, back.model_name, back.hook_name) == (activation, sae.k, "tiny_bert_sva",
                                                                         "blocks.2.hook_resid_post")


def test_layer_hooks_round_trip():
    assert [saelens.layer_hook(k) for k in (0, 1, 7)] == ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post",
                                                         "blocks.6.hook_resid_post"]
    assert all(saelens.hook_layer(saelens.layer_hook(k)) == k for k in range(12))


# ------------------------------------------------------------------------------ the sites a study reads
def test_at_site_sets_the_layer_and_model_of_sae_methods_only():
    lat, bridged, mean = INTERVENTIONS.get("sae_latents"), INTERVENTIONS.get("sae_direction"), DIRECTIONS.get("mean")
    assert loads_sae(lat) and loads_sae(bridged) and loads_sae(DIRECTIONS.get("sae")) and not loads_sae(mean)
    assert at_site(mean, {"x": 1}, 3, "m") == {"x": 1}
    assert at_site(lat, {"k": 4}, 3, "m") == {"k": 4, "layer": 3, "model": "m"}
    assert at_site(bridged, {"model": "own"}, 3, "m") == {"model": "own", "layer": 3}  # a set model is kept
    assert at_site(lat, {"layer": 3}, 3) == {"layer": 3}
    with pytest.raises(ConfigError, match="layer=6 but the study reads this SAE at layer 3"):
        at_site(lat, {"layer": 6}, 3)


def test_one_folder_per_layer(tmp_path):
    pattern = str(DATA / "layers" / "layer_{layer}")
    lat = INTERVENTIONS.get("sae_latents")
    check_sites(lat, {"path": pattern}, [3, 4], "tiny_bert_sva")  # each layer its own folder, each recording it
    check_sites(lat, {"path": pattern}, "all", "tiny_bert_sva")  # symbolic: every folder the pattern matches
    with pytest.raises(ConfigError, match="trained on model 'tiny_bert_sva'"):
        check_sites(lat, {"path": pattern}, "last", "pythia_70m")
    with pytest.raises(ConfigError, match="lacks cfg.json"):
        check_sites(lat, {"path": pattern}, [3, 5], "tiny_bert_sva")  # no folder for layer 5
    built = INTERVENTIONS.build({"name": "sae_latents", **at_site(lat, {"path": pattern}, 4)})
    assert built.path.endswith("layer_4")
    unresolved = INTERVENTIONS.build({"name": "sae_latents", "path": pattern})  # no site yet: checked per site
    with pytest.raises(ConfigError, match="no layer is set here"):
        unresolved.fit(torch.randn(8, 12), torch.arange(8) % 2)


def test_one_folder_at_every_layer_is_refused_at_the_others():
    """The issue's case: one loaded SAE at every layer of a multi-layer run. Its hook is checked at each."""
    lat, folder = INTERVENTIONS.get("sae_latents"), str(DATA / "standard")  # blocks.2.hook_resid_post = layer 3
    check_sites(lat, {"path": folder}, [3], "tiny_bert_sva")
    with pytest.raises(ConfigError, match=r"hook 'blocks.2.hook_resid_post' \(cfg.json hook_name\), not at layer 4 "
                                          r"\(blocks.3.hook_resid_post\)"):
        check_sites(lat, {"path": folder}, [3, 4], "tiny_bert_sva")
    with pytest.raises(ConfigError, match="not at layer 2"):  # at fit time, the site a study reaches
        INTERVENTIONS.build({"name": "sae_latents", **at_site(lat, {"path": folder}, 2)})
    with pytest.raises(ConfigError, match="trained on model"):  # the model, whatever the layers
        check_sites(lat, {"path": folder}, "last", "pythia_70m")


def test_a_trained_sae_records_its_model_and_hook(tmp_path, monkeypatch):
    monkeypatch.setenv("CPROBE_CACHE_DIR", str(tmp_path))
    X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    small = {"d_sae": 8, "k": 2, "epochs": 1}
    m = INTERVENTIONS.build({"name": "sae_latents", **at_site(INTERVENTIONS.get("sae_latents"), small, 3, "tiny")})
    m.fit(X, torch.arange(64) % 2)
    assert (m.sae_.model_name, m.sae_.hook_name) == ("tiny", "blocks.2.hook_resid_post")
    (entry,) = [p for p in (tmp_path / "sae").iterdir() if (p / saelens.CFG).is_file()]
    cfg = json.loads((entry / saelens.CFG).read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.2.hook_resid_post" and no_nulls(cfg)


# ------------------------------------------------------------------------------ through SAELens itself
def sae_lens():
    """SAELens itself: skipped where it is not installed, unless ``CPROBE_REQUIRE_SAELENS`` is set (``make
    test-saelens``, which CI runs), where its absence fails."""
    if os.environ.get("CPROBE_REQUIRE_SAELENS", "") not in ("", "0"):
        import sae_lens as sl

        return sl
    return pytest.importorskip("sae_lens")


def _train_tiny(activation: str) -> SAE:
    X = torch.randn(256, 8, generator=torch.Generator().manual_seed(1)) * 3 + 1
    sae = train(minibatches(X, 64, 0), 8, TrainSettings(architecture=activation, d_sae=16, k=3, epochs=2))
    sae.model_name, sae.hook_name = "tiny_bert_sva", saelens.layer_hook(2)
    return sae


@pytest.mark.parametrize("activation", ["topk", "relu", "jumprelu"])
def test_saelens_loads_what_cprobe_writes(tmp_path, activation):
    sl = sae_lens()
    if activation == "jumprelu":
        base = _train_tiny("relu")
        sae = dataclasses.replace(base, activation="jumprelu", threshold=torch.rand(16))
    else:
        sae = _train_tiny(activation)
    saelens.save(sae, tmp_path)
    theirs = sl.SAE.load_from_disk(tmp_path)
    assert theirs.cfg.architecture() == {"relu": "standard"}.get(activation, activation)
    assert (theirs.cfg.metadata.model_name, theirs.cfg.metadata.hook_name) == ("tiny_bert_sva",
                                                                                "blocks.1.hook_resid_post")
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(2)) * 3 + 1
    with torch.no_grad():
        f = theirs.encode(x)
        assert torch.equal(f != 0, sae.encode(x) != 0)
        torch.testing.assert_close(sae.encode(x), f, atol=ATOL, rtol=0)
        torch.testing.assert_close(sae.decode(f), theirs.decode(f), atol=ATOL, rtol=0)
    cfg_keys = set(json.loads((tmp_path / saelens.CFG).read_text()))
    assert cfg_keys == set(theirs.cfg.to_dict())  # SAELens's own dict of the SAE it read has the same keys


def test_saelens_writes_and_cprobe_reads_every_kind(tmp_path):
    sl = sae_lens()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 8, generator=g) * 2
    made = {"standard": (sl.StandardSAE, sl.StandardSAEConfig, {}), "topk": (sl.TopKSAE, sl.TopKSAEConfig, {"k": 3}),
            "topk_rescale": (sl.TopKSAE, sl.TopKSAEConfig, {"k": 3, "rescale_acts_by_decoder_norm": True}),
            "jumprelu": (sl.JumpReLUSAE, sl.JumpReLUSAEConfig, {})}
    for name, (cls, cfg_cls, extra) in made.items():
        theirs = cls(cfg_cls.from_dict({"architecture": cfg_cls.architecture(),
                                        "d_in": 8, "d_sae": 16, **extra,
                                        "metadata": {"model_name": "m", "hook_name": "blocks.4.hook_resid_post"}}))
        with torch.no_grad():
            theirs.W_enc.copy_(torch.randn(8, 16, generator=g))
            theirs.W_dec.copy_(torch.randn(16, 8, generator=g) * (0.2 + 2 * torch.rand(16, 1, generator=g)))
            theirs.b_enc.copy_(torch.randn(16, generator=g) * 0.1)
            theirs.b_dec.copy_(torch.randn(8, generator=g) * 0.1)
            if hasattr(theirs, "threshold"):
                theirs.threshold.copy_(torch.rand(16, generator=g))
        theirs.save_model(tmp_path / name)
        ours = saelens.load(tmp_path / name)
        assert (ours.model_name, ours.hook_name) == ("m", "blocks.4.hook_resid_post")
        with torch.no_grad():
            f = theirs.encode(x)
            assert torch.equal(ours.encode(x) != 0, f != 0), name
            torch.testing.assert_close(ours.encode(x), f, atol=ATOL, rtol=0)
            torch.testing.assert_close(ours.decode(f), theirs.decode(f), atol=ATOL, rtol=0)


def test_saelens_reads_the_old_keys_as_cprobe_does(tmp_path):
    """A hand-made cfg of the old format (hook_point, activation_fn_str topk + activation_fn_kwargs.k): SAELens's own
    conversion gives the architecture, k and hook cprobe reads."""
    sl = sae_lens()
    cfg = {"d_in": 2, "d_sae": 3, "hook_point": "blocks.3.hook_resid_post", "model_name": "gpt2-small",
           "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2}, "k": 3, "dtype": "float32"}
    write(tmp_path, cfg, weights())
    theirs, ours = sl.SAE.load_from_disk(tmp_path), saelens.read_cfg(tmp_path)
    assert (theirs.cfg.architecture(), theirs.cfg.k, theirs.cfg.metadata.hook_name, theirs.cfg.metadata.model_name) \
        == (ours["activation"], ours["k"], ours["hook_name"], ours["model_name"])


def test_the_pinned_keys_are_saelens_fields():
    sl = sae_lens()
    for arch, cfg_cls in (("standard", sl.StandardSAEConfig), ("topk", sl.TopKSAEConfig),
                          ("jumprelu", sl.JumpReLUSAEConfig)):
        assert [f.name for f in dataclasses.fields(cfg_cls)] + ["architecture"] == KEYS_OF[arch]
