"""Write tests/data/saelens/: tiny SAEs saved by SAELens's own code, and what SAELens computes from them.

Needs SAELens installed (not a cprobe dependency; tests/data/saelens/README.md names the version used):

    python scripts/make_saelens_data.py tests/data/saelens

Only SAELens's public API is called: its SAE and config classes (``from_dict``), ``SAE.save_model``,
``TrainingSAE.save_inference_model``, ``SAE.load_from_disk``, ``encode`` and ``decode``. Each folder is an SAE of
d_in = 12, d_sae = 24 with seeded random weights (biases nonzero, decoder rows of unequal norms), recorded for the
tiny BERT (``tiny_bert_sva``); ``expected.safetensors`` holds the inputs ``x`` (16 × 12) and, per folder, SAELens's
``encode(x)`` and ``decode(encode(x))`` of the SAE it loads from that folder (keys ``<folder>.encode`` /
``<folder>.decode``, ``/`` written as ``.``). The inputs are drawn so that no TopK choice or JumpReLU threshold is
within 1e-3 of a tie, so float rounding on another CPU cannot change which latents are active.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

D_IN, D_SAE, K, N = 12, 24, 4, 16
MODEL = "tiny_bert_sva"


def _randomise(sae, gen: torch.Generator, norms: bool = True) -> None:
    """Seeded weights: W_enc, b_enc, b_dec nonzero; decoder rows of norms in [0.3, 3] (``norms``)."""
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D_IN, D_SAE, generator=gen) / D_IN ** 0.5)
        W_dec = torch.randn(D_SAE, D_IN, generator=gen)
        scale = 0.3 + 2.7 * torch.rand(D_SAE, 1, generator=gen) if norms else 1.0
        sae.W_dec.copy_(W_dec / W_dec.norm(dim=1, keepdim=True) * scale)
        sae.b_dec.copy_(0.2 * torch.randn(D_IN, generator=gen))
        if getattr(sae, "b_enc", None) is not None:
            sae.b_enc.copy_(0.1 * torch.randn(D_SAE, generator=gen))
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(0.05 + 0.3 * torch.rand(D_SAE, generator=gen))
        if hasattr(sae, "b_gate"):
            sae.b_gate.copy_(0.1 * torch.randn(D_SAE, generator=gen))
            sae.b_mag.copy_(0.1 * torch.randn(D_SAE, generator=gen))
            sae.r_mag.copy_(0.1 * torch.randn(D_SAE, generator=gen))


def _cfg(cls, arch: str, hook: str, **extra):
    return cls.from_dict({"architecture": arch, "d_in": D_IN, "d_sae": D_SAE, **extra,
                          "metadata": {"model_name": MODEL, "hook_name": hook}})


def folders() -> dict[str, tuple]:
    """name → (SAE class, config class, architecture, hook, extra config, training save?)."""
    import sae_lens as sl

    post2 = "blocks.2.hook_resid_post"  # cprobe layer 3
    return {
        "standard": (sl.StandardSAE, sl.StandardSAEConfig, "standard", post2, {}, False),
        "topk": (sl.TopKSAE, sl.TopKSAEConfig, "topk", post2, {"k": K}, False),
        "topk_rescale": (sl.TopKSAE, sl.TopKSAEConfig, "topk", post2, {"k": K, "rescale_acts_by_decoder_norm": True},
                         False),
        "topk_trained": (sl.TopKTrainingSAE, sl.TopKTrainingSAEConfig, "topk", post2, {"k": K}, True),
        "jumprelu": (sl.JumpReLUSAE, sl.JumpReLUSAEConfig, "jumprelu", post2, {"apply_b_dec_to_input": False}, False),
        "gated": (sl.GatedSAE, sl.GatedSAEConfig, "gated", post2, {}, False),
        "mlp_out": (sl.StandardSAE, sl.StandardSAEConfig, "standard", "blocks.2.hook_mlp_out", {}, False),
        "layers/layer_3": (sl.StandardSAE, sl.StandardSAEConfig, "standard", post2, {}, False),
        "layers/layer_4": (sl.StandardSAE, sl.StandardSAEConfig, "standard", "blocks.4.hook_resid_pre", {}, False),
    }


def _clear_of_ties(sae, x: torch.Tensor) -> bool:
    """No TopK choice or JumpReLU threshold within 1e-3 of a tie on ``x``."""
    with torch.no_grad():
        if getattr(sae, "b_enc", None) is None:
            return True  # the gated SAE: cprobe refuses it, nothing is compared
        pre = sae.process_sae_in(x) @ sae.W_enc + sae.b_enc
        if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
            pre = pre * sae.W_dec.norm(dim=-1)
        if hasattr(sae.cfg, "k"):
            top = pre.topk(sae.cfg.k + 1, dim=-1).values
            if bool(((top[:, -2] - top[:, -1]).abs() < 1e-3).any()) or bool((top[:, :-1].abs() < 1e-3).any()):
                return False
        if hasattr(sae, "threshold"):
            return not bool(((pre - sae.threshold).abs() < 1e-3).any())
        return not bool((pre.abs() < 1e-3).any())


def main() -> None:
    import sae_lens as sl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    out = ap.parse_args().out
    gen = torch.Generator().manual_seed(0)
    specs = folders()
    saes = {}
    for name, (cls, cfg_cls, arch, hook, extra, training) in specs.items():
        sae = cls(_cfg(cfg_cls, arch, hook, **extra))
        _randomise(sae, gen)
        saes[name] = sae
    for attempt in range(100):
        x = 1.5 * torch.randn(N, D_IN, generator=gen) + 0.3
        if all(_clear_of_ties(sae, x) for sae in saes.values()):
            break
    else:
        raise SystemExit("no tie-free inputs in 100 draws")
    if taken := [str(out / n) for n in [*specs, "expected.safetensors"] if (out / n).exists()]:
        raise SystemExit(f"{taken} exist: remove them first (nothing is overwritten)")
    expected = {"x": x}
    for name, (cls, cfg_cls, arch, hook, extra, training) in specs.items():
        folder = out / name
        (saes[name].save_inference_model if training else saes[name].save_model)(folder)
        if arch == "gated":
            continue  # cprobe refuses it; nothing to compare
        loaded = sl.SAE.load_from_disk(folder)
        with torch.no_grad():
            f = loaded.encode(x)
            expected[f"{name.replace('/', '.')}.encode"] = f.contiguous()
            expected[f"{name.replace('/', '.')}.decode"] = loaded.decode(f).contiguous()
        print(f"{name}: {json.loads((folder / 'cfg.json').read_text())['architecture']}, "
              f"L0 {float((f != 0).float().sum(1).mean()):.1f}")
    save_file(expected, str(out / "expected.safetensors"), metadata={"sae_lens_version": sl.__version__,
                                                                      "tie_free_draw": str(attempt)})
    print(f"wrote {out} with SAELens {sl.__version__}")


if __name__ == "__main__":
    main()
