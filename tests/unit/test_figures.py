"""Every figure stands alone: its title names what it shows, the property, the model, the data, n and the seed
(issue 25: `accuracy_by_layer.png` had panels titled `z_c` / `z_e` only)."""

from __future__ import annotations

import pandas as pd
import pytest

from cprobe.plots import caption, new_figure, save
from tests.conftest import assert_figures_captioned, read_caption


def test_caption_puts_every_field_in_the_title_and_the_png_metadata(tmp_path):
    fig, (ax,) = new_figure(1)
    ax.plot([0, 1], [0, 1])
    title = caption(fig, "Accuracy by layer", property=["z_c", "z_e"], model=pd.Series(["m", "m"]),
                    data="synthetic_sva", n={"z_c": 599, "z_e": 390}, seed=[0, 1, 2, 3, 4, 5])
    assert title == ("Accuracy by layer\nproperty: z_c, z_e · model: m · data: synthetic_sva · n: z_c 599, z_e 390 · "
                     "seed: 0, 1, 2, 3, … (6 in all)")
    save(fig, tmp_path / "f.png")
    cap = read_caption(tmp_path / "f.png")
    assert cap["title"] == title and cap["property"] == "z_c, z_e" and cap["n"] == "z_c 599, z_e 390"
    from PIL import Image

    with Image.open(tmp_path / "f.png") as im:
        assert im.text["Title"].startswith("Accuracy by layer — property: z_c, z_e")


def test_an_uncaptioned_figure_is_refused_under_the_strict_check(tmp_path, monkeypatch):
    monkeypatch.setenv("CPROBE_STRICT_FIGURES", "1")
    fig, (ax,) = new_figure(1)
    ax.set_title("z_c")
    with pytest.raises(ValueError, match=r"does not name its \['property', 'model', 'data', 'n'\]"):
        save(fig, tmp_path / "bare.png")
    fig, _ = new_figure(1)
    caption(fig, "x", property="z_c", model="m", data="", n=3)
    with pytest.raises(ValueError, match=r"\['data'\]"):
        save(fig, tmp_path / "partial.png")
    monkeypatch.setenv("CPROBE_STRICT_FIGURES", "0")  # users' runs: written, never failed for a title
    fig, _ = new_figure(1)
    save(fig, tmp_path / "bare.png")
    assert read_caption(tmp_path / "bare.png") is None


def test_probing_accuracy_by_layer_names_property_model_data_n_and_seed(tmp_path):
    from cprobe.tasks.probing import report

    rows = [dict(model="tiny_bert_sva", dataset="synthetic_sva", property=p, layer=l, probe=pr, accuracy=0.9,
                 majority=0.5, n_test=n, seed=0, task="probing")
            for p, n in (("z_c", 599), ("z_e", 390)) for l in range(5) for pr in ("linear", "mlp")]
    report(pd.DataFrame(rows), tmp_path)
    (png,) = assert_figures_captioned(tmp_path)
    cap = read_caption(png)
    assert (cap["property"], cap["model"], cap["data"], cap["seed"]) == ("z_c, z_e", "tiny_bert_sva", "synthetic_sva",
                                                                         "0")
    assert cap["n"] == "z_c 599, z_e 390 test items"


def test_reliability_figures_name_the_target_property(tmp_path):
    from cprobe.tasks.reliability import report
    from tests.unit.test_reliability_task import _table

    report(_table(), tmp_path)
    pngs = assert_figures_captioned(tmp_path)
    assert len(pngs) == 4
    assert all(read_caption(p)["property"] == "z_c (targeted)" and read_caption(p)["model"] == "m layer 4"
               for p in pngs)


def test_cebab_figure_names_aspects_model_split_pairs_and_seeds(tmp_path):
    from cprobe.tasks.cebab import report

    rows = [{"kind": "icace_error", "model": "minilm_l6", "cebab_task": "5way", "train_variant": "exclusive",
             "eval_split": "test", "explainer": ex, "distance": "l2", "aspect": a, "direction": "all", "value": v,
             "n": 200 if a == "all" else 50, "seed": seed, "split": "", "metric": "icace_error"}
            for seed in (0, 1) for ex, v in (("random", 0.9), ("approx", 0.5)) for a in ("food", "service", "all")]
    report(pd.DataFrame(rows), tmp_path)
    (png,) = assert_figures_captioned(tmp_path)
    cap = read_caption(png)
    assert cap["property"] == "food, service" and cap["n"] == "200 pairs" and cap["seed"] == "0, 1"
    assert cap["data"] == "CEBaB, train exclusive, test edit pairs"
