"""SAEs (cprobe.sae): the TopK activation, encode/decode, the latent edit that keeps the error term, FVU / L0 / dead
fraction, SAELens folders and their one-line refusals, the selection rules, the cache, the ``sae_decoder`` direction and
``sae_latents`` intervention on a hand-made SAE, and training that recovers a planted sparse dictionary."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from cprobe.sae import saelens, select, store
from cprobe.sae.dictionary import SAE, topk_relu
from cprobe.sae.quality import Quality, measure
from cprobe.sae.train import TrainSettings, minibatches, train


def hand_sae(**kw) -> SAE:
    """d_in = 2, d_sae = 3, ReLU, b_dec = 0 unless given: latent 0 reads x₀, latent 1 reads x₁, latent 2 reads −x₀."""
    args = dict(W_enc=torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]]), b_enc=torch.zeros(3),
                W_dec=torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]]), b_dec=torch.zeros(2), activation="relu")
    return SAE(**{**args, **kw})


def write_folder(path, sae: SAE, **cfg) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    save_file(tensors, str(path / saelens.WEIGHTS))
    (path / saelens.CFG).write_text(json.dumps({"d_in": sae.d_in, "d_sae": sae.d_sae, "architecture": "standard",
                                                "activation_fn_str": "relu", "apply_b_dec_to_input": True,
                                                "normalize_activations": "none", **cfg}))


# ------------------------------------------------------------------------------------ the dictionary
def test_topk_keeps_the_k_largest_relud():
    pre = torch.tensor([[1.0, -2.0, 3.0, 0.5], [-1.0, -2.0, -3.0, -0.5]])
    assert torch.equal(topk_relu(pre, 2), torch.tensor([[1.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(topk_relu(pre, 9), pre.relu())  # k above the width: every entry, ReLU'd


def test_encode_decode_by_hand():
    sae = hand_sae(b_dec=torch.tensor([1.0, 0.0]), b_enc=torch.tensor([0.0, -1.0, 0.0]))
    x = torch.tensor([[3.0, 2.0]])
    # pre = (x − b_dec) W_enc + b_enc = [2, 2, −2] + [0, −1, 0] = [2, 1, −2]; ReLU → [2, 1, 0]
    assert torch.equal(sae.encode(x), torch.tensor([[2.0, 1.0, 0.0]]))
    # x̂ = f W_dec + b_dec = [2, 0] + [0, 2] + [1, 0] = [3, 2]
    assert torch.equal(sae.decode(sae.encode(x)), torch.tensor([[3.0, 2.0]]))
    no_bdec = hand_sae(b_dec=torch.tensor([1.0, 0.0]), apply_b_dec_to_input=False)
    assert torch.equal(no_bdec.encode(x), torch.tensor([[3.0, 2.0, 0.0]]))
    topk = hand_sae(activation="topk", k=1)
    assert torch.equal(topk.encode(x), torch.tensor([[3.0, 0.0, 0.0]]))
    jump = hand_sae(activation="jumprelu", threshold=torch.tensor([2.5, 2.5, 0.0]))
    assert torch.equal(jump.encode(x), torch.tensor([[3.0, 0.0, 0.0]]))  # 2 is under its threshold 2.5


def test_shapes_and_activation_are_checked():
    with pytest.raises(ValueError, match="W_dec has shape"):
        hand_sae(W_dec=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="k >= 1"):
        hand_sae(activation="topk")
    with pytest.raises(ValueError, match="threshold"):
        hand_sae(activation="jumprelu")


def test_edit_keeps_the_error_term():
    sae = hand_sae()
    x = torch.tensor([[3.0, 2.0], [-1.0, 0.5]])
    # f = [[3, 2, 0], [0, 0.5, 1]]; the reconstruction is not x for row 0 (x̂ = [3, 4]): the error term is kept
    null = sae.edit(x, torch.tensor([0]), None)  # latent 0 zeroed: x − f₀ W_dec[0]
    assert torch.allclose(null, torch.tensor([[0.0, 2.0], [-1.0, 0.5]]))
    cf = sae.edit(x, torch.tensor([1, 2]), torch.tensor([[1.0, 4.0], [0.5, 1.0]]))
    # row 0: Δf = [1 − 2, 4 − 0] → x + (−1)·[0, 2] + 4·[−1, 0] = [−1, 0]; row 1: Δf = 0 → x exactly
    assert torch.allclose(cf[0], torch.tensor([-1.0, 0.0]))
    assert torch.equal(cf[1], x[1])
    assert torch.equal(sae.edit(x, torch.tensor([2]), None)[0], x[0])  # zeroing a zero latent returns x exactly


# ------------------------------------------------------------------------------------ quality
def test_fvu_l0_dead_by_hand_and_streamed():
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    x_hat = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    f = torch.tensor([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    q = Quality(3)
    q.update(x, x_hat, f)
    # SSE = 1; mean state [1, 0], Σ‖x − x̄‖² = 1 + 1 = 2 → FVU 0.5; one latent per row; latents 0 and 2 never fire
    assert q.report() == {"fvu": 0.5, "l0": 1.0, "dead_fraction": pytest.approx(2 / 3), "n": 2.0}
    q2 = Quality(3)
    q2.update(x[:1], x_hat[:1], f[:1])
    q2.update(x[1:], x_hat[1:], f[1:])
    assert q2.report() == q.report()


def test_measure_on_the_hand_sae():
    sae = hand_sae()
    x = torch.tensor([[3.0, 2.0], [-1.0, 0.0]])
    # f = [[3, 2, 0], [0, 0, 1]], x̂ = [[3, 4], [−1, 0]]: SSE = 4; x̄ = [1, 1], Σ‖x − x̄‖² = 4 + 1 + 4 + 1 = 10
    assert measure(sae, x, batch_size=1) == {"fvu": pytest.approx(0.4), "l0": 1.5, "dead_fraction": 0.0, "n": 2.0}


# ------------------------------------------------------------------------------------ SAELens folders
def test_saelens_folder_loads_and_round_trips(tmp_path):
    sae = hand_sae(b_dec=torch.tensor([0.5, -0.5]))
    write_folder(tmp_path / "a", sae,
                 metadata={"model_name": "google/gemma-3-270m", "hook_name": "blocks.5.hook_resid_post"})
    got = saelens.load(tmp_path / "a")
    assert got.activation == "relu" and got.model_name == "google/gemma-3-270m" and got.hook_name.startswith("blocks.5")
    assert torch.equal(got.W_dec, sae.W_dec) and torch.equal(got.b_dec, sae.b_dec)
    topk = hand_sae(activation="topk", k=2)
    (tmp_path / "b").mkdir()
    saelens.save(topk, tmp_path / "b")
    back = saelens.load(tmp_path / "b")
    assert back.activation == "topk" and back.k == 2 and torch.equal(back.W_enc, topk.W_enc)
    write_folder(tmp_path / "c", sae, architecture="standard", activation_fn_str="topk", activation_fn_kwargs={"k": 1})
    assert saelens.load(tmp_path / "c").k == 1  # SAELens 5's TopK spelling


@pytest.mark.parametrize(("cfg", "drop", "message"), [
    ({}, saelens.WEIGHTS, "lacks sae_weights.safetensors"),
    ({}, saelens.CFG, "lacks cfg.json"),
    ({"architecture": "gated"}, None, "architecture 'gated'"),
    ({"normalize_activations": "expected_average_only_in"}, None, "normalize_activations"),
    ({"d_sae": 7}, None, "d_sae=7 but the weights have 3"),
])
def test_saelens_bad_folders_are_one_line(tmp_path, cfg, drop, message):
    write_folder(tmp_path, hand_sae(), **cfg)
    if drop:
        (tmp_path / drop).unlink()
    with pytest.raises(ConfigError, match=message) as e:
        saelens.load(tmp_path)
    assert "\n" not in str(e.value)


def test_width_model_and_hook_are_checked(tmp_path):
    write_folder(tmp_path, hand_sae(), model_name="google/gemma-3-270m", hook_name="blocks.5.hook_resid_post")
    cfg = saelens.read_cfg(tmp_path)
    saelens.check_recorded(cfg, "x", model="gemma3_270m", layer=6)  # one name across spellings; 6 = blocks.5 post
    saelens.check_width(hand_sae(), 2, "x")
    with pytest.raises(ConfigError, match="width 2, but the states here have width 640"):
        saelens.check_width(hand_sae(), 640, "x")
    with pytest.raises(ConfigError, match="trained on model 'google/gemma-3-270m'.*not 'tiny_neox_sva'"):
        saelens.check_recorded(cfg, "x", model="tiny_neox_sva")
    with pytest.raises(ConfigError, match="hook 'blocks.5.hook_resid_post'.*not at layer 3"):
        saelens.check_recorded(cfg, "x", layer=3)
    # the methods refuse it when they are built (validation), before any states exist
    with pytest.raises(ConfigError, match="trained on model"):
        INTERVENTIONS.build({"name": "sae_latents", "path": str(tmp_path), "model": "pythia_70m"})
    with pytest.raises(ConfigError, match="lacks cfg.json"):
        DIRECTIONS.build({"name": "sae_decoder", "path": str(tmp_path / "nowhere")})


def test_hook_layers():
    assert saelens.hook_layer("blocks.3.hook_resid_post") == 4
    assert saelens.hook_layer("blocks.4.hook_resid_pre") == 4
    assert saelens.hook_layer("blocks.3.hook_mlp_out") is None


def test_intervention_refuses_a_folder_of_the_wrong_width(tmp_path):
    write_folder(tmp_path, hand_sae())
    iv = INTERVENTIONS.build({"name": "sae_latents", "path": str(tmp_path)}, seed=0)
    with pytest.raises(ConfigError, match="width 2, but the states here have width 5"):
        iv.fit(torch.randn(10, 5), torch.arange(10) % 2)


# ------------------------------------------------------------------------------------ selection
def test_mean_diff_scores_by_hand():
    F = torch.tensor([[1.0, 0.0], [0.0, 0.0], [3.0, 1.0], [1.0, 1.0]])
    z = torch.tensor([0, 0, 1, 1])
    # μ₀ = [0.5, 0], μ₁ = [2, 1]
    got = select.scores("mean_diff", hand_sae(), torch.zeros(4, 2), F, z)
    assert torch.equal(got, torch.tensor([1.5, 1.0]).double())
    assert select.top(torch.tensor([1.0, 3.0, 3.0, 2.0]), 3).tolist() == [1, 2, 3]  # ties to the lower index
    F3 = torch.tensor([[3.0], [0.0], [0.0]])
    # three classes, one row each: class 0 vs the rest 3 − 0 = 3; class 1 and 2: 0 − 1.5 → max |·| = 3
    assert select.one_vs_rest(F3, torch.tensor([0, 1, 2]))[:, 0].tolist() == [3.0, -1.5, -1.5]


def test_probe_and_attribution_rules():
    g = torch.Generator().manual_seed(0)
    z = torch.arange(200) % 2
    X = torch.randn(200, 2, generator=g)
    X[:, 0] += 4 * z - 2  # the property on x₀ only
    sae = hand_sae()
    F = sae.encode(X)
    probe = select.scores("probe", sae, X, F, z)
    attribution = select.scores("attribution", sae, X, F, z)
    assert float(probe[1]) < float(probe[0]) and float(probe[1]) < float(probe[2])  # latent 1 reads x₁: no signal
    # latent 1's decoder row is orthogonal to the probe's (x₀) gradient up to noise: its attribution is small
    assert float(attribution[1]) < 0.1 * min(float(attribution[0]), float(attribution[2]))
    dead = torch.cat([F, torch.zeros(200, 1)], 1)
    assert float(select.scores("probe", sae, X, dead, z)[3]) == 0.0  # a latent that never fires scores 0


# ------------------------------------------------------------------------------------ the methods on a hand SAE
def test_sae_direction_is_the_signed_decoder_row(tmp_path):
    write_folder(tmp_path, hand_sae())
    X = torch.tensor([[2.0, 1.0], [3.0, 0.0], [-1.0, 1.0], [-2.0, 0.0]])
    y = torch.tensor([1, 1, 0, 0])
    # f: latent 0 = relu(x₀) → class means 2.5 / 0; latent 2 = relu(−x₀) → 0 / 1.5; latent 1 = x₁: 0.5 / 0.5
    d = DIRECTIONS.build({"name": "sae_decoder", "path": str(tmp_path)}, seed=0).fit(X, y)
    assert d.latents_.tolist() == [0] and torch.allclose(d.a, torch.tensor([1.0, 0.0]))
    d2 = DIRECTIONS.build({"name": "sae_decoder", "path": str(tmp_path), "latents": 2}, seed=0).fit(X, y)
    # a ∝ 2.5·[1, 0] + (−1.5)·[−1, 0] = [4, 0]
    assert d2.latents_.tolist() == [0, 2] and torch.allclose(d2.a, torch.tensor([1.0, 0.0]))
    flipped = DIRECTIONS.build({"name": "sae_decoder", "path": str(tmp_path)}, seed=0).fit(X, 1 - y)
    assert torch.allclose(flipped.a, torch.tensor([-1.0, 0.0]))  # points to class 1


def test_sae_intervention_formulas(tmp_path):
    write_folder(tmp_path, hand_sae())
    X = torch.tensor([[2.0, 1.0], [3.0, 0.0], [-1.0, 1.0], [-2.0, 0.0]])
    z = torch.tensor([1, 1, 0, 0])
    cf = INTERVENTIONS.build({"name": "sae_latents", "path": str(tmp_path), "latents": 2}, seed=0).fit(X, z)
    assert cf.latents_.tolist() == [0, 2] and torch.equal(cf.targets_, torch.tensor([[0.0, 1.5], [2.5, 0.0]]))
    # row [2, 1] to class 0: f_S = [2, 0] → [0, 1.5]: x + (−2)·[1, 0] + 1.5·[−1, 0] = [−1.5, 1]
    assert torch.allclose(cf.transform(X[:1], torch.tensor([0])), torch.tensor([[-1.5, 1.0]]))
    at_target = torch.tensor([[2.5, 7.0]])  # its latents 0 and 2 are already class 1's means [2.5, 0]
    assert torch.equal(cf.transform(at_target, torch.tensor([1])), at_target)
    null = INTERVENTIONS.build({"name": "sae_latents", "path": str(tmp_path), "latents": 2, "kind": "nullifying"},
                               seed=0).fit(X, z)
    # f_S zeroed: x − 2·[1, 0] = [0, 1] and x − 2·[−1, 0]·… for row −2: f₂ = 2 → x − 2·[−1, 0] = [0, 0]
    assert torch.allclose(null.transform(X[[0, 3]]), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ConfigError, match="z_target"):
        cf.transform(X)


def test_unknown_and_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="unknown key"):
        INTERVENTIONS.build({"name": "sae_latents", "width": 3})
    with pytest.raises(ConfigError, match="unknown SAE select"):
        DIRECTIONS.build({"name": "sae_decoder", "select": "max"})
    with pytest.raises(ConfigError, match="architecture"):
        INTERVENTIONS.build({"name": "sae_latents", "architecture": "gated"})
    with pytest.raises(ConfigError, match="kind must be"):
        INTERVENTIONS.build({"name": "sae_latents", "kind": "both"})


# ------------------------------------------------------------------------------------ training and the cache
def planted(n: int, d: int, atoms: int, active: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(atoms, d, generator=g)
    D /= D.norm(dim=1, keepdim=True)
    idx = torch.rand(n, atoms, generator=g).topk(active, dim=1).indices
    f = torch.zeros(n, atoms).scatter_(1, idx, 1 + torch.rand(n, active, generator=g))
    return f @ D, D


@pytest.mark.parametrize("architecture", ["topk", "relu"])
def test_training_recovers_a_planted_sparse_dictionary(architecture):
    X, D = planted(4000, 16, 24, 2)
    s = TrainSettings(architecture=architecture, d_sae=48, k=2, l1=1.0, epochs=20, batch_size=128, seed=0)
    sae = train(minibatches(X, s.batch_size, s.seed), 16, s)
    W = sae.W_dec / sae.W_dec.norm(dim=1, keepdim=True)
    recovered = float(((D @ W.T).max(1).values >= 0.9).float().mean())
    q = measure(sae, X)
    # measured: all 24 atoms for both, FVU 0.02 (TopK) / 0.08 (ReLU, L0 6.4); 48 random unit rows reach cos 0.71 at best
    assert recovered >= 0.9, recovered
    assert q["fvu"] < 0.15, q
    if architecture == "topk":
        assert q["l0"] <= 2.0
    else:
        assert q["l0"] < 8.0, q  # sparse: well under the 48 latents


def test_trained_sae_is_cached_by_content(tmp_path):
    X, _ = planted(300, 8, 8, 1)
    s = TrainSettings(d_sae=8, k=1, epochs=2)
    first, q1 = store.trained(X, s, tmp_path)
    again, q2 = store.trained(X.clone(), s, tmp_path)
    assert torch.equal(first.W_dec, again.W_dec) and q1 == q2
    entries = list((tmp_path / "sae").iterdir())
    assert len([e for e in entries if e.is_dir()]) == 1
    assert store.key(X, s) != store.key(X, TrainSettings(d_sae=8, k=1, epochs=3))
    X2 = X.clone()
    X2[0, 0] += 1
    assert store.key(X, s) != store.key(X2, s)
    entry = tmp_path / "sae" / store.key(X, s)
    assert saelens.load(entry).k == 1 and (entry / "checksums.json").is_file()  # a loadable SAELens folder



def test_the_intervention_configs_take_the_jobs_model_and_cache_switch():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.cli import REPO

    for name in ("sae_latents", "sae_decoder_direction", "sae_axbench_direction", "sae_diffmean_direction"):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", f"intervention={name}",
                                               "cache.enabled=false"])
        node = OmegaConf.to_container(cfg.intervention, resolve=True)
        assert (node["model"], node["cache"]) == ("tiny_bert_sva", False)
