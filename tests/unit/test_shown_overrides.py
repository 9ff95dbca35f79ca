"""Every override the README or a config comment shows parses exactly as written — through cprobe's own argument
normalisation and Hydra's override grammar — and, where it names no placeholder and sweeps nothing, composes against
the experiment it is about (a key the node lacks needs ``+``: ``+dataset.columns.target=verb_index``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO

KEY = re.compile(r"^(\+{0,2}|~)[A-Za-z_][\w/]*(\.[\w@]+)*(@[\w.]+)?=")
PLACEHOLDERS = ("FILE", "DIR", "NAME", "PATH", "<dir>", "<that dir>", "IMPORT_PATH", "...", "KIND", "<name>",
                "my_lab", "MODULE", "group=option", "key=value", "experiment=x", "/path/to", "|", "<")
STUDY = {"cebab": "cebab", "liberty": "liberty_cv", "causalgym": "causalgym", "reliability": "sva_tiny_reliability",
         "prompt_bias": "lama_bias", "intervention": "sva_tiny_reliability", "probing": "sva_tiny"}


def _tokens(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def _overrides(tokens: list[str]) -> list[str]:
    """The override tokens: ``key=value`` with a config-like key (environment variables, ``make`` variables and
    empty values in prose are not overrides)."""
    out = []
    for t in tokens:
        key, _, value = t.partition("=")
        if not KEY.match(t) or t.startswith(("hydra.", "--")) or key.isupper() or not value:
            continue
        out.append(t)
    return out


def readme_spans() -> list[tuple[str, list[str]]]:
    """(where, override tokens) of every README inline code span and ```bash line with an override."""
    text = (REPO / "README.md").read_text()
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        spans = re.findall(r"`([^`]+)`", line) if not line.startswith("cprobe ") else [line]
        for span in spans:
            if re.search(r"\w\(", span):  # Python (`ModelAdapter.run(batch, read=...)`), not overrides
                continue
            toks = _tokens(span)
            if toks and _overrides(toks):
                out.append((f"README.md:{i}", toks))
    return out


def config_spans() -> list[tuple[str, list[str]]]:
    """(where, tokens) of every example a comment in conf/ shows: its `code spans`, and its example lines (indented
    after the ``#``, or starting with ``cprobe``)."""
    out = []
    for f in sorted((REPO / "conf").rglob("*.yaml")):
        if f.parent.name == "scm":  # structural causal models: their comments are about variables, not overrides
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if "#" not in line or line.lstrip().startswith("# @package"):
                continue
            comment = line.split("#", 1)[1]
            spans = re.findall(r"`([^`]+)`", comment)
            if comment.startswith("   ") or comment.strip().startswith("cprobe "):
                spans.append(comment.strip())
            for span in spans:
                if re.search(r"\w\(", span):
                    continue
                toks = _tokens(span)
                if toks and _overrides(toks):
                    out.append((f"{f.relative_to(REPO)}:{i}", toks))
    return out


SPANS = readme_spans() + config_spans()


def test_the_collector_finds_the_overrides_it_must():
    shown = {t for _, toks in SPANS for t in _overrides(toks)}
    assert "'dataset.strip_tokens=[<eos>]'".strip("'") in shown
    assert any(t.startswith("dataset.pair_by=[") for t in shown)
    assert len(SPANS) > 30


def test_every_shown_override_parses():
    from cprobe._hydra import normalise, parses

    bad = []
    for where, tokens in SPANS:
        argv, _ = normalise(_overrides(tokens), resolve=False)
        bad += [f"{where}: {a}" for a in argv if not parses(a)]
    assert not bad, f"overrides that do not parse as Hydra overrides: {bad}"


@pytest.fixture(scope="module")
def hydra_conf():
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield


def _option_with(group: str, key: str) -> str | None:
    """The first option of ``group`` whose file has the top-level ``key`` (the one a bare ``group.key=`` is about)."""
    for f in sorted((REPO / "conf" / group).glob("*.yaml")):
        if re.search(rf"^{re.escape(key)}:", f.read_text(), re.M):
            return f.stem
    return None


def _composable(tokens: list[str]) -> bool:
    text = " ".join(tokens)
    if any(p in text for p in PLACEHOLDERS) or "-m" in tokens or "--multirun" in tokens or "hydra/launcher" in text:
        return False
    # a sweep (a,b outside brackets and braces) composes one job at a time: not here
    return not any("," in re.sub(r"[\[{(].*?[\]})]", "", t.split("=", 1)[1]) for t in _overrides(tokens))


def _to_compose() -> list[tuple[str, list[str]]]:
    """The composable spans, each distinct override list once; a bare ``+experiment=x`` is left to
    ``test_configs.py`` (every experiment composes there)."""
    seen, out = set(), []
    for where, tokens in SPANS:
        over = tuple(_overrides(tokens))
        if not _composable(tokens) or over in seen or (len(over) == 1 and "experiment=" in over[0]):
            continue
        seen.add(over)
        out.append((where, tokens))
    return out


COMPOSE = _to_compose()


@pytest.mark.parametrize(("where", "tokens"), COMPOSE, ids=[w for w, _ in COMPOSE])
def test_every_shown_override_composes(where, tokens, hydra_conf):
    from hydra import compose

    from cprobe._hydra import normalise

    over = _overrides(tokens)
    argv, _ = normalise(over, resolve=False)
    for group in ("dataset", "model"):  # `dataset.path=...` alone is about the dataset that has that key
        if any(a.lstrip("+~").startswith(f"{group}.") for a in argv) and not any(
                a.lstrip("+").startswith(f"{group}=") for a in argv):
            key = next(a.lstrip("+~").split("=")[0].split(".")[1] for a in argv if a.lstrip("+~").startswith(f"{group}."))
            owner = _option_with(group, key)
            if owner:
                argv = [f"{group}={owner}", *normalise([*argv], resolve=False)[0]]
    exp = [a for a in argv if a.lstrip("+").startswith("experiment=")]
    if not exp:
        head = over[0].lstrip("+~").split(".")[0].split("=")[0]
        m = re.match(r"conf/experiment/(?:base/)?(\w+)\.yaml", where)
        study = m.group(1) if m and (REPO / "conf/experiment" / f"{m.group(1)}.yaml").is_file() else None
        if m and study is None:  # conf/experiment/base/<study>.yaml: the study's first experiment
            study = STUDY.get(m.group(1))
        ds = next((a.split("=", 1)[1] for a in argv if a.startswith("dataset=")), "")
        by_data = "cebab" if ds == "cebab" else "liberty_cv" if ds.startswith("liberty") else None
        argv = [f"+experiment={study or by_data or STUDY.get(head, 'sva_tiny')}", *argv]
    try:
        compose("config", overrides=argv)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{where}: {over} does not compose: {str(e).splitlines()[0]}")
