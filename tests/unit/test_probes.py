"""Linear and MLP probes: accuracy, grid selection, validation use, config errors."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.probes import PROBES, build_probe
from cprobe.probes.linear import LinearProbe
from cprobe.probes.mlp import MLPProbe
from tests.unit.test_inlp import gaussian_classes


def xor_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadrant labels: not linearly separable, easy for an MLP."""
    X = torch.rand(n, 2, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return X, ((X[:, 0] > 0) ^ (X[:, 1] > 0)).long()


def test_registry_names() -> None:
    assert {"linear", "mlp"} <= set(PROBES.names())


@pytest.mark.parametrize("k", [2, 3])
def test_linear_probe_separable(k: int) -> None:
    X, z = gaussian_classes(900, 16, k)
    probe = LinearProbe(lrs=(1e-2,), epochs=4).fit(X[:600], z[:600])
    assert probe.score(X[600:], z[600:]) > 0.95
    proba = probe.predict_proba(X[600:])
    assert proba.shape == (300, k) and torch.allclose(proba.sum(-1), torch.ones(300), atol=1e-5)
    assert probe.module(X[:3]).shape == (3, k)  # raw logits, differentiable
    assert probe.module(X[:3].requires_grad_()).requires_grad


def test_mlp_beats_linear_on_xor() -> None:
    X, z = xor_data(1500)
    mlp = MLPProbe(n_layers=(1,), widths=(64,), lrs=(1e-2,), epochs=20).fit(X[:1000], z[:1000])
    lin = LinearProbe(lrs=(1e-2,), epochs=20).fit(X[:1000], z[:1000])
    assert mlp.score(X[1000:], z[1000:]) > 0.9
    assert lin.score(X[1000:], z[1000:]) < 0.7


def test_picks_best_grid_point() -> None:
    X, z = gaussian_classes(600, 8)
    probe = LinearProbe(lrs=(1e-7, 1e-1), epochs=2).fit(X, z)
    accs = [acc for _, acc in probe.grid_results]
    assert len(accs) == 2 and accs[1] > accs[0]
    assert probe.best_params == {"lr": 0.1}
    assert probe.val_accuracy == max(accs)


def test_mlp_grid_is_the_product() -> None:
    X, z = gaussian_classes(200, 4)
    probe = MLPProbe(n_layers=(1, 2), widths=(8,), lrs=(1e-3, 1e-2), epochs=1).fit(X, z)
    assert [p for p, _ in probe.grid_results] == [
        {"n_layers": n, "width": 8, "lr": lr} for n in (1, 2) for lr in (1e-3, 1e-2)
    ]
    assert set(probe.best_params) == {"n_layers", "width", "lr"}


def test_uses_given_validation_split() -> None:
    X, z = gaussian_classes(600, 8)
    probe = LinearProbe(lrs=(1e-2,), epochs=3).fit(X[:400], z[:400], X[400:], 1 - z[400:])
    # scored on the (flipped binary) labels we passed, not on a held-out part of X
    assert probe.val_accuracy == pytest.approx(1 - probe.score(X[400:], z[400:]))


def test_seeded_fit_is_reproducible() -> None:
    X, z = gaussian_classes(300, 8)
    a = MLPProbe(n_layers=(1,), widths=(16,), lrs=(1e-2,), epochs=2, seed=3).fit(X, z)
    b = MLPProbe(n_layers=(1,), widths=(16,), lrs=(1e-2,), epochs=2, seed=3).fit(X, z)
    assert torch.equal(a.logits(X), b.logits(X))


def test_build_probe_from_config() -> None:
    probe = build_probe({"name": "mlp", "n_layers": [1], "widths": [8], "lrs": [0.01], "epochs": 1})
    assert isinstance(probe, MLPProbe) and probe.widths == (8,)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"name": "svm"}, "unknown probe 'svm'"),
        ({"epochs": 3}, "needs a 'name'"),
        ({"name": "linear", "lr": 0.1}, r"unknown key\(s\) \['lr'\].*'lrs'"),
        ({"name": "linear", "lrs": []}, "lrs grid is empty"),
        ({"name": "linear", "lrs": [-0.1]}, "positive"),
        ({"name": "mlp", "widths": [64.5]}, "positive integers"),
        ({"name": "mlp", "val_fraction": 1.5}, "val_fraction"),
        ({"name": "mlp", "epochs": 0}, "epochs"),
    ],
)
def test_config_errors(cfg: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_probe(cfg)


@pytest.mark.parametrize("lrs", [(1e-2, 1e-1), (1e-1, 1e-2)])
def test_accuracy_ties_go_to_the_lower_validation_loss(lrs) -> None:
    """On separable data every lr reaches 100%; the best-trained (most confident) probe must win, not the
    first grid point nor the last (a barely trained probe's soft outputs would inflate nullifying completeness)."""
    from cprobe.probes.linear import LinearProbe

    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, 2, (400,), generator=g)
    X = torch.randn(400, 8, generator=g)
    X[:, 0] += 10.0 * (2 * z - 1)  # a wide margin: every learning rate separates it
    probe = LinearProbe(lrs=lrs, epochs=8).fit(X, z)
    accs = [acc for _, acc in probe.grid_results]
    assert accs[0] == accs[1] == 1.0
    assert probe.best_params["lr"] == 1e-1
    assert probe.predict_proba(X).max(-1).values.mean() > 0.95


@pytest.mark.parametrize("cfg", [{"name": "linear", "lrs": [0.01], "epochs": 3},
                                 {"name": "mlp", "n_layers": [2], "widths": [16], "lrs": [0.01], "epochs": 3}])
def test_save_load_roundtrip_without_pickle(tmp_path, cfg) -> None:
    from cprobe.probes.grid import load_probe, save_probe

    X, z = gaussian_classes(200, 6, k=3)
    probe = build_probe(cfg).fit(X, z)
    save_probe(probe, tmp_path / "p.safetensors")
    assert (tmp_path / "p.safetensors").read_bytes()[:8] != b"\x80\x04\x95"  # not a pickle
    again = load_probe(build_probe(cfg), tmp_path / "p.safetensors")
    torch.testing.assert_close(again.predict_proba(X), probe.predict_proba(X))
    assert again.best_params == probe.best_params and again.n_classes == 3


def test_probe_fits_are_cached_by_activations_config_and_seed(tmp_path, monkeypatch) -> None:
    """A warm demo reads its probe fits back instead of refitting them (issue 25): same weights, same scores."""
    from cprobe.probes.grid import fit_cached

    X, z = gaussian_classes(300, 6)
    Xv, zv = gaussian_classes(100, 6, seed=1)
    cfg = {"name": "mlp", "n_layers": [1], "widths": [8], "lrs": [1e-2], "epochs": 2}
    first, src = fit_cached(build_probe(cfg, seed=0), X, z, Xv, zv, cache_dir=tmp_path)
    assert src == "fit" and len(list(tmp_path.glob("*.safetensors"))) == 1
    fits = []
    real_fit = MLPProbe.fit
    monkeypatch.setattr(MLPProbe, "fit", lambda self, *a, **k: fits.append(1) or real_fit(self, *a, **k))
    again, src = fit_cached(build_probe(cfg, seed=0), X, z, Xv, zv, cache_dir=tmp_path)
    assert src == "cache" and not fits
    assert torch.equal(again.logits(Xv), first.logits(Xv)) and again.best_params == first.best_params
    # anything that changes the fit misses: the seed, a setting, the activations, the labels, the validation split
    X2 = X.clone()
    X2[0, 0] += 1e-3
    for probe, args in [(build_probe(cfg, seed=1), (X, z, Xv, zv)), (build_probe({**cfg, "epochs": 3}, seed=0),
                        (X, z, Xv, zv)), (build_probe(cfg, seed=0), (X2, z, Xv, zv)),
                        (build_probe(cfg, seed=0), (X, 1 - z, Xv, zv)), (build_probe(cfg, seed=0), (X, z, None, None))]:
        assert fit_cached(probe, *args, cache_dir=tmp_path)[1] == "fit"
    assert len(fits) == 5
    # without a cache dir (cache.enabled=false) it simply fits
    assert fit_cached(build_probe(cfg, seed=0), X, z, Xv, zv, cache_dir=None)[1] == "fit"


def test_a_corrupt_cached_probe_fit_is_refit(tmp_path) -> None:
    from cprobe.probes.grid import fit_cached

    X, z = gaussian_classes(200, 4)
    cfg = {"name": "linear", "lrs": [1e-2], "epochs": 1}
    fit_cached(build_probe(cfg, seed=0), X, z, cache_dir=tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10
    f.write_bytes(bytes(data))
    assert fit_cached(build_probe(cfg, seed=0), X, z, cache_dir=tmp_path)[1] == "fit"
    assert fit_cached(build_probe(cfg, seed=0), X, z, cache_dir=tmp_path)[1] == "cache"


def test_fits_on_worker_processes_are_bitwise_the_fits_made_here(monkeypatch, tmp_path):
    """fit_cached_many spreads many fits over worker processes (the demo's 20 probes: two cores instead of one);
    each fit runs as it would here, so the probes are the same to the bit, in the tasks' order, and the cache
    serves them the second time."""
    import multiprocessing

    from cprobe.probes import grid

    X, y = gaussian_classes(n=300, d=8, k=2, seed=0)

    def tasks():
        return [(MLPProbe(n_layers=(1,), widths=(16,), lrs=(1e-2,), epochs=2, seed=s), X, y, None, None)
                for s in range(3)] + [(LinearProbe(lrs=(0.1,), epochs=2), X, y, None, None)]

    here = [p for p, _, _ in grid.fit_cached_many(tasks(), processes=1)]
    assert grid.fit_steps(tasks()[0][0], 240) == 1 * 2 * 4  # grid points x epochs x batches
    pools = []

    spawn = multiprocessing.get_context("spawn")
    real = spawn.Pool
    monkeypatch.setattr(spawn, "Pool", lambda n, *a, **k: pools.append(n) or real(n, *a, **k))
    assert [s for _, s, _ in grid.fit_cached_many(tasks(), processes=2)] == ["fit"] * 4 and pools == []  # too few
    monkeypatch.setattr(grid, "PARALLEL_MIN_STEPS", 0)
    there = list(grid.fit_cached_many(tasks(), tmp_path, processes=2))
    assert pools == [2] and [s for _, s, _ in there] == ["fit"] * 4
    for a, (b, _, _) in zip(here, there, strict=True):
        assert a.best_params == b.best_params and a.val_accuracy == b.val_accuracy
        for (k, v), w in zip(a.module.state_dict().items(), b.module.state_dict().values(), strict=True):
            assert torch.equal(v, w), k
    assert [s for _, s, _ in grid.fit_cached_many(tasks(), tmp_path, processes=2)] == ["cache"] * 4


def test_fits_on_worker_processes_stop_when_their_consumer_does(monkeypatch, tmp_path):
    """Ctrl-C (or SIGTERM, or an error) while worker processes fit probes: leaving fit_cached_many terminates the
    workers at once — the queued fits are not trained first (the executor it replaced waited for all of them: a
    minute after Ctrl-C in the demo)."""
    from cprobe.probes import grid

    monkeypatch.setattr(grid, "PARALLEL_MIN_STEPS", 0)
    X, y = gaussian_classes(n=2000, d=16, k=2, seed=0)
    tasks = [(MLPProbe(n_layers=(1,), widths=(64,), lrs=(1e-2,), epochs=40, seed=s), X, y, None, None)
             for s in range(8)]
    fits = grid.fit_cached_many(tasks, tmp_path, processes=2)
    assert next(fits)[1] == "fit"
    fits.close()  # what a KeyboardInterrupt at the consumer's yield does
    done = len(list(tmp_path.glob("*.safetensors")))
    assert done < len(tasks)
    import time

    time.sleep(2)
    assert len(list(tmp_path.glob("*.safetensors"))) == done  # nothing fits on after the close


def test_the_grid_uses_adams_fused_update_where_the_device_has_one_and_foreach_elsewhere():
    """torch checks a fused optimizer's device only at its first step: the grid asks first (a meta tensor stands for
    a device without the kernel)."""
    probe = MLPProbe(n_layers=[1], widths=[4], lrs=[0.01], epochs=1, batch_size=4, seed=0)
    cpu = probe._adam(torch.nn.Linear(3, 2), 0.01)
    assert cpu.defaults["fused"] and not cpu.defaults["foreach"]
    meta = probe._adam(torch.nn.Linear(3, 2, device="meta"), 0.01)
    assert not meta.defaults["fused"] and meta.defaults["foreach"]
