"""Time an SAE's training at the issue-46 size: 100k states of width 640, 4,096 latents (docs/sae.md).

    python scripts/bench_sae.py synthetic [--n 100000] [--d 640] [--d-sae 4096] [--k 32] [--epochs 5]
    python scripts/bench_sae.py states FILE.safetensors   # a (n, d) tensor "states", e.g. written by `gemma` below
    python scripts/bench_sae.py gemma --layer 6 --tokens 100000 --out states.safetensors --save SAE_DIR
    python scripts/bench_sae.py splice SAE_DIR --layer 6 --n 200   # the LM loss it adds at the last token

``synthetic``: states drawn from a planted sparse dictionary (4,096 unit atoms, 16 active per row with exponential
magnitudes, plus Gaussian noise at 5 % of the signal's variance); also reports how many planted atoms the SAE
recovers (a decoder row with cosine ≥ 0.9). ``gemma``: every token's residual state at ``--layer`` of the installed
``gemma3_270m`` over CEBaB's review texts (``$CPROBE_DATA_DIR/cebab``), the start token left out, the blocks above
``--layer + 1`` skipped. ``--save DIR`` keeps the trained SAE (a SAELens folder, with a ``checksums.json`` of its
files); ``DIR`` must be new or empty, or with ``--force`` hold an SAE this script saved and nothing else, unchanged
since (its checksums), which is replaced; ``--out FILE`` likewise (``--force``: a states file it wrote, with cprobe's
checksums). Both are checked before any work. ``splice`` reads the SAE back and
measures the LM loss it adds spliced into ``gemma3_270m`` at ``--layer`` at the last token of ``--n`` reviews
(:func:`cprobe.sae.splice.loss_added`: KL to the clean pass). Run it with ``OMP_NUM_THREADS`` set to the cores it may use; it reports wall and CPU seconds (on a shared machine the wall time
also counts waiting for a core).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from cprobe.io import (MANIFEST, atomic_save_tensors, has_manifest, read_json, verify_manifest, write_manifest,
                       written_tensors)
from cprobe.sae.quality import measure
from cprobe.sae.saelens import CFG, WEIGHTS
from cprobe.sae.train import TrainSettings, minibatches, train


def check_outputs(save: str | None, out: str | None, force: bool) -> None:
    """Before any work, one line and exit 1 unless ``--save`` is new or empty and ``--out`` new; ``--force`` lets
    them hold only what this script wrote (an SAE whose checksums.json lists its two files, unchanged; a states file
    with cprobe's checksums), never anything else."""
    if save and (folder := Path(save)).exists() and (not folder.is_dir() or any(folder.iterdir())):
        held = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        ours = (set(held) <= {CFG, WEIGHTS, MANIFEST} and has_manifest(folder)
                and set(read_json(folder / MANIFEST) or {}) == {CFG, WEIGHTS} and verify_manifest(folder) is None)
        if not (force and ours):
            shown = f" (it holds {', '.join(held[:3])}{' ...' if len(held) > 3 else ''})" if held else ""
            raise SystemExit(f"error: --save {folder} is not a new or empty folder{shown}; " + (
                "--force replaces only an SAE this script saved there, unchanged since: pick another folder" if force
                else "pick another folder, or --force to replace an SAE this script saved there"))
    if out and (Path(out).exists() or Path(out).is_symlink()) and not (force and written_tensors(Path(out))):
        raise SystemExit(f"error: --out {out} exists; pick another file" + (
            "" if force else ", or --force to replace a states file this script wrote"))


def planted(n: int, d: int, atoms: int, active: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(atoms, d, generator=g)
    D /= D.norm(dim=1, keepdim=True)
    X = torch.empty(n, d)
    for i in range(0, n, 10_000):
        m = min(10_000, n - i)
        idx = torch.rand(m, atoms, generator=g).topk(active, dim=1).indices
        mag = -torch.log(torch.rand(m, active, generator=g))  # Exp(1)
        f = torch.zeros(m, atoms).scatter_(1, idx, mag)
        X[i:i + m] = f @ D
    X += torch.randn(n, d, generator=g) * (X.var() * 0.05).sqrt()
    return X, D


def gemma_states(layer: int, tokens: int) -> torch.Tensor:
    from cprobe.api import load_model

    adapter = load_model("gemma3_270m")
    model, tok = adapter.model, adapter.tok
    # blocks 1..layer+1 kept: hidden_states[layer] is then block `layer`'s output (cprobe's Site(layer)), not the final
    # norm's, which HF applies to the last kept block's output
    model.model.layers = model.model.layers[:layer + 1]
    texts = reviews()
    out, got = [], 0
    with torch.inference_mode():
        for text in texts:
            ids = tok(text, return_tensors="pt").input_ids[:, :256]
            h = model.model(input_ids=ids, output_hidden_states=True).hidden_states[layer][0]
            out.append(h[1:].float())  # every token but the start token
            got += len(h) - 1
            if got >= tokens:
                break
    return torch.cat(out)[:tokens]


def splice(folder: str, layer: int, n: int) -> dict[str, float]:
    from cprobe.api import load_model
    from cprobe.data.items import TextItem
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.sites import Site
    from cprobe.sae import saelens
    from cprobe.sae.splice import loss_added

    texts = list(reviews())[-n:]  # the last reviews: not the ones the SAE was trained on first
    items = [TextItem(f"r{i}", t, regions=(t,)) for i, t in enumerate(texts)]
    t0 = time.perf_counter()
    kl = loss_added(load_model("gemma3_270m"), items, RegionFormatter(), Site(layer, "last"), saelens.load(folder))
    return {"loss_added_nats": round(kl, 4), "items": len(items), "seconds": round(time.perf_counter() - t0, 1)}


def reviews() -> dict[str, None]:
    from cprobe.paths import data_dir

    return dict.fromkeys(r["description"] for f in sorted((data_dir() / "cebab").glob("*.json"))
                         for r in json.loads(f.read_text()) if r.get("description"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["synthetic", "states", "gemma", "splice"])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--n", type=int, help="synthetic: rows (100,000); splice: reviews (200)")
    ap.add_argument("--d", type=int, default=640)
    ap.add_argument("--d-sae", type=int, default=4096)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--layer", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--out")
    ap.add_argument("--save")
    ap.add_argument("--force", action="store_true", help="replace a --save SAE / --out file this script wrote")
    a = ap.parse_args()
    check_outputs(a.save, a.out, a.force)
    if a.mode == "splice":
        print(json.dumps(splice(a.file, a.layer, a.n or 200)))
        return
    D = None
    t0, c0 = time.perf_counter(), time.process_time()
    if a.mode == "synthetic":
        X, D = planted(a.n or 100_000, a.d, a.d_sae, 16)
    elif a.mode == "states":
        from safetensors.torch import load_file
        X = load_file(a.file)["states"].float()
    else:
        X = gemma_states(a.layer, a.tokens)
        if a.out:
            atomic_save_tensors(Path(a.out), {"states": X})
    t_data, c_data = time.perf_counter() - t0, time.process_time() - c0
    s = TrainSettings(architecture="topk", d_sae=a.d_sae, k=a.k, epochs=a.epochs, batch_size=a.batch_size)
    t0, c0 = time.perf_counter(), time.process_time()
    sae = train(minibatches(X, s.batch_size, s.seed), X.shape[1], s)
    t_train, c_train = time.perf_counter() - t0, time.process_time() - c0
    report = {"states": list(X.shape), "data_seconds": round(t_data, 1),
              "data_cpu_seconds": round(c_data, 1), "train_seconds": round(t_train, 1),
              "train_cpu_seconds": round(c_train, 1),
              "threads": torch.get_num_threads(), **{k: round(v, 4) for k, v in measure(sae, X).items()},
              "settings": s.as_dict()}
    if a.save:
        from cprobe.sae import saelens

        Path(a.save).mkdir(parents=True, exist_ok=True)
        sae.model_name, sae.hook_name = "gemma3_270m", f"blocks.{a.layer - 1}.hook_resid_post"
        saelens.save(sae, Path(a.save))
        write_manifest(Path(a.save), [CFG, WEIGHTS])  # what --force may replace
    if D is not None:
        W = sae.W_dec / sae.W_dec.norm(dim=1, keepdim=True)
        report["planted_atoms_recovered_cos0.9"] = float(((D @ W.T).max(1).values >= 0.9).float().mean())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
