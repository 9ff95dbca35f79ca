"""Nothing cprobe did not write is ever deleted or overwritten (issue 43).

- :func:`test_every_deletion_site_is_audited`: every call in ``src/`` that deletes, moves or renames a file (found in
  the syntax tree) is a site of :data:`AUDIT`, which says why it is safe, and docs/architecture.md lists it;
- ``test_a_users_file_survives[<site>]``: the user's files placed where the site would hit survive byte for byte
  (and the site still removes what cprobe wrote, so a mutant that removes nothing fails too);
- ``test_bad_input_keeps_the_users_files[<case>]``: the issue's cases through the real command line (in process):
  exit 1, one line naming the problem, the user's directory byte for byte as it was — a sweep's job folder of the
  user's (every launcher), a finished run's ``status.json`` under a failed start (issues 43, 51);
- ``test_every_deletion_site_in_scripts_is_audited`` and ``test_a_script_keeps_the_users_files[<case>]``: the same for
  ``scripts/`` (what they delete is their own temporary directory; what they write never replaces a user's file)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cprobe import ownership
from cprobe.paths import LATEST
from tests.cli import REPO, assert_refused
from tests.cli import run as cli

AUDIT: dict[str, str] = {
    "ownership.undo": "removes only what a Made recorded before creation: the directory when made here, parents made "
                      "here while empty, in a directory that existed only new entries; latest only if it still points "
                      "here",
    "ownership.remove": "the deleter of undo and cache clear; each caller decides that cprobe wrote the path",
    "ownership.point": "replaces latest only when it is a symlink to a sibling's name; the temporary link gets a "
                       "fresh name (symlink fails on an existing one)",
    "cache.build_lock": "the owner file is written only when absent or an owner record, removed only when written "
                        "here",
    "cache._publish": "replaces an entry only when it holds cprobe's checksums.json; anything else in the way is a "
                      "one-line error; the temporary directory is its own (mkdtemp)",
    "cache.checked_entry": "removes only temporary directories of killed builds, named .<entry>.tmp-*.cprobe-tmp",
    "cache.Entry.read_shard": "a shard's name (<key>/<tensor>/<a>-<b>.safetensors) inside an activation entry cprobe "
                              "made; nothing else in the entry is touched",
    "cache.Entry.read": "as Entry.read_shard",
    "cache._clear_activations": "an activation entry (meta.json): only meta.json, checksummed shards and temporaries",
    "io.atomic_write_with": "the temporary is mkstemp's own new name (O_EXCL); it replaces only the target, inside a "
                            "directory cprobe may write (a checked run or sweep dir, the cache)",
    "models.classifier.finetuned_classifier": "the training checkpoint this call wrote or verified "
                                              "(<name>-<content hash>.partial.safetensors in the cache)",
    "models.gguf._joined": "unlinks the joined copy it wrote into the cache build's own temporary directory when its "
                           "sha256 is wrong; the package's chunks are only read",
    "models.gguf.dequantised.build": "unlinks the joined copy only when it lies in the build's own temporary "
                                     "directory (file.parent == tmp); a user's .gguf is only read",
    "outputs.collect": "writes into a staging dir of its own (mkdtemp, removed after), then moves each file in only "
                       "when the target is absent, in a run or sweep of cprobe's, or listed in the directory's "
                       ".cprobe-outputs.json (what collect / report wrote there before)",
    "records.write_records": "removes record_items.parquet only when it is one (config_id, metric, item, value "
                             "columns)",
    "trackers.lifecycle.sweep_discarded": "removes trackers.json only when it is what sweep_started writes ({tracker: "
                                          "{destination, ...}})",
    "trackers.tensorboard.TensorBoardTracker.discard_sweep": "removes a parent run's log dir only when it holds "
                                                             "nothing but TensorBoard event files",
}
"""Every deletion, move or rename in ``src/`` (module.function, as :func:`deletion_sites` names them) and why it is
safe."""

CLEAN_UPS: dict[str, str] = {
    "pipeline._run_job": "a single run's config error: ownership.undo of what on_run_start recorded (nothing without "
                         "cprobe's callback)",
    "callbacks.release_sweep_dir": "a refused SLURM submission: ownership.undo of the claim",
    "search._discard": "an invalid search: ownership.undo of the claim",
    "cache.clear_cache": "only entries cprobe wrote (checksums.json, activation meta.json, checksummed safetensors, a "
                         "kind's own JSON file) and leftovers (.cprobe-tmp, lock owner records); the rest is reported",
}
"""The clean-ups that delete through :func:`cprobe.ownership.remove` / :func:`~cprobe.ownership.undo`."""

SRC = REPO / "src" / "cprobe"
_OPS = {"rmtree", "unlink", "rmdir", "remove", "replace", "rename", "move", "removedirs"}


def deletion_sites(root: Path = SRC, prefix: str = "") -> set[str]:
    """``module.function`` of every call in ``src/`` that deletes, moves or renames a file: ``shutil``/``os``'s
    (``rmtree``, ``remove``, ``replace``, ``rename``, ``move``, ...), ``.unlink()``/``.rmdir()``, and a one-argument
    ``.replace(target)``/``.rename(target)`` (a path's; a string's and a frame's take more or name their arguments)."""
    found = set()
    for f in sorted(root.rglob("*.py")):
        module = prefix + ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        stack: list[str] = []

        class Visitor(ast.NodeVisitor):
            def scoped(self, node: ast.AST) -> None:
                stack.append(node.name)  # type: ignore[attr-defined]
                self.generic_visit(node)
                stack.pop()

            visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = scoped

            def visit_Call(self, node: ast.Call) -> None:
                fn = node.func
                if isinstance(fn, ast.Attribute) and fn.attr in _OPS:
                    on = fn.value.id if isinstance(fn.value, ast.Name) else None
                    path_method = (fn.attr in ("unlink", "rmdir", "rmtree", "removedirs")
                                   or (fn.attr in ("replace", "rename") and len(node.args) == 1 and not node.keywords
                                       and not isinstance(fn.value, ast.Subscript | ast.Constant)))
                    if on in ("os", "shutil") or path_method:
                        found.add(".".join([module, *stack]))
                self.generic_visit(node)

        Visitor().visit(ast.parse(f.read_text()))
    return found


def test_every_deletion_site_is_audited():
    sites = deletion_sites()
    assert sites == set(AUDIT), (f"not audited: {sorted(sites - set(AUDIT))}; "
                                 f"no longer in src/: {sorted(set(AUDIT) - sites)}")
    assert set(CASES) == set(AUDIT) | set(CLEAN_UPS), sorted((set(AUDIT) | set(CLEAN_UPS)) ^ set(CASES))
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert not [s for s in CASES if f"`{s}`" not in doc], "docs/architecture.md lists every site"


_HYDRA = "hydra:\n  callbacks:\n    aggregate:\n      _target_: {}\n"


@pytest.mark.parametrize("files,cprobes", [
    ({"status.json": '{"state": "done", "started": 1.0, "task": "probing"}'}, True),
    ({".hydra/hydra.yaml": _HYDRA.format(ownership.CALLBACK), ".hydra/config.yaml": "seed: 0\n"}, True),
    ({"multirun.yaml": "name: x\n" + _HYDRA.format(ownership.CALLBACK)}, True),
    ({".slurm/sweep.json": '{"version": 1, "points": {}}'}, True),
    ({"status.json": '{"state": "done"}'}, False),  # not what a job writes
    ({"status.json": "done"}, False),
    ({".hydra/hydra.yaml": _HYDRA.format("my_app.Callback")}, False),  # another Hydra app's run
    ({".hydra/hydra.yaml": "not: [valid"}, False),
    ({"multirun.yaml": "hydra: {}\n"}, False),
    ({".slurm/sweep.json": "[]"}, False),
    ({"notes.txt": "mine"}, False),
])
def test_a_directory_is_cprobe_s_by_its_own_records(tmp_path, files, cprobes):
    from cprobe.errors import CprobeError

    for name, text in files.items():
        _mine(tmp_path / "d" / name, text)
    assert ownership.written_by_cprobe(tmp_path / "d") is cprobes
    if cprobes:
        ownership.check_target(tmp_path / "d", "hydra.run.dir")
    else:
        with pytest.raises(CprobeError, match=r"^hydra.run.dir=\S+/d holds files cprobe did not write \("):
            ownership.check_target(tmp_path / "d", "hydra.run.dir")
    (tmp_path / "empty").mkdir()
    ownership.check_target(tmp_path / "empty", "hydra.run.dir")  # empty
    ownership.check_target(tmp_path / "new", "hydra.run.dir")  # new
    with pytest.raises(CprobeError, match="is not a directory"):
        ownership.check_target(tmp_path / "d" / next(iter(files)), "hydra.run.dir")


def tree(root: Path) -> dict[str, str]:
    """Every file and link under ``root``: relative path -> a hash of its bytes (a link: its target)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _mine(path: Path, text: str = "the user's own") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _kept(before: dict[str, str], root: Path) -> None:
    """Every file of ``before`` is still under ``root``, byte for byte."""
    now = tree(root)
    assert {k: now.get(k) for k in before} == before


CASES: dict[str, Callable[[Path], None]] = {}


def case(*sites: str) -> Callable:
    def add(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        for s in sites:
            CASES[s] = fn
        return fn
    return add


# ----------------------------------------------------------------------------------------------- run and sweep dirs
@case("ownership.undo", "ownership.remove")
def _undo(tmp: Path) -> None:
    from cprobe.job import write_status

    work = tmp / "work"
    _mine(work / "notes.txt")
    earlier = tmp / "earlier"  # an earlier cprobe run (its record and log), with a file of the user's
    write_status(earlier, state="failed", started=0.0)
    _mine(earlier / ".hydra" / "overrides.yaml", "- layers=2\n")
    _mine(earlier / "cprobe.log", "[INFO] wrote metrics.csv\n")
    _mine(earlier / "notes.txt")
    empty = tmp / "empty"  # the user's empty directory
    empty.mkdir()
    before = tree(tmp)
    made = ownership.record(work / "a" / "run")  # a/ and run/ are new
    (work / "a" / "run" / ".hydra").mkdir(parents=True)
    (work / "a" / "run" / "cprobe.log").write_text("log")
    theirs = _mine(work / "a" / "theirs.txt")  # appeared meanwhile, in a parent this process made
    again = ownership.record(earlier)
    (earlier / ".hydra" / "overrides.yaml").write_text("- layers=99\n")  # what Hydra writes at a start, then the
    with open(earlier / "cprobe.log", "a") as log:  # config is refused
        log.write("[ERROR] layers=[99] out of range\n")
    (earlier / "extra").mkdir()
    chosen = ownership.record(empty)
    (empty / "cprobe.log").write_text("log")
    for m in (made, again, chosen):
        ownership.undo(m)
    assert theirs.read_text() == "the user's own"
    theirs.unlink()
    assert tree(tmp) == before and empty.is_dir() and (work / "a").is_dir() and not (work / "a" / "run").exists()
    assert not (earlier / "extra").exists()


@case("ownership.point")
def _point(tmp: Path) -> None:
    from cprobe.callbacks import claim_dir

    runs = tmp / "runs"
    _mine(runs / LATEST)  # a file named latest
    _mine(runs / f".{LATEST}.{os.getpid()}")  # the temporary name cprobe used before
    (tmp / "elsewhere").mkdir()
    (tmp / "sweeps").mkdir()
    (tmp / "sweeps" / LATEST).symlink_to(tmp / "elsewhere")  # the user's link elsewhere
    before = tree(tmp)
    for parent in ("runs", "sweeps"):
        made = claim_dir(tmp / parent / "2024-01-01_00-00-00")
        ownership.link_latest(made)
        assert not made.linked
    _kept(before, tmp)
    # cprobe's own link is moved, and a failed start points it back
    (tmp / "mine").mkdir()
    (tmp / "mine" / "old").mkdir()
    (tmp / "mine" / LATEST).symlink_to("old")
    made = claim_dir(tmp / "mine" / "new")
    ownership.link_latest(made)
    assert made.linked and os.readlink(tmp / "mine" / LATEST) == "new"
    ownership.undo(made)
    assert os.readlink(tmp / "mine" / LATEST) == "old" and sorted(p.name for p in (tmp / "mine").iterdir()) == \
        [LATEST, "old"]


@case("callbacks.release_sweep_dir")
def _release(tmp: Path) -> None:
    from cprobe.callbacks import release_sweep_dir

    sweep = tmp / "sweep"  # an earlier SLURM sweep, a file of the user's in it
    _mine(sweep / ".slurm" / "sweep.json", json.dumps({"version": 1}))
    _mine(sweep / "notes.txt")
    _mine(tmp / "beside.txt")
    empty = tmp / "empty"
    empty.mkdir()
    before = tree(tmp)
    made, chosen = ownership.record(sweep), ownership.record(empty)
    _mine(sweep / "trackers.json", "{}")
    _mine(empty / "multirun.yaml", "x")
    release_sweep_dir(made)
    release_sweep_dir(chosen)
    assert tree(tmp) == before and empty.is_dir()


@case("search._discard")
def _discard(tmp: Path) -> None:
    from omegaconf import OmegaConf

    from cprobe.search import _discard as discard

    parent = tmp / "mine"
    _mine(parent / "notes.txt")
    sweep = parent / "sweep"
    sweep.mkdir()  # the user's empty directory, chosen as hydra.sweep.dir
    before = tree(tmp)
    ownership.MADE[ownership.key(sweep)] = ownership.record(sweep)
    _mine(sweep / "multirun.yaml", "x")
    discard(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert tree(tmp) == before and sweep.is_dir()


@case("trackers.lifecycle.sweep_discarded")
def _trackers(tmp: Path) -> None:
    from omegaconf import OmegaConf

    from cprobe.trackers import TRACKERS_FILE, sweep_discarded

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp)}}})
    _mine(tmp / TRACKERS_FILE, json.dumps({"my": "notes"}))
    before = tree(tmp)
    sweep_discarded(config)
    assert tree(tmp) == before
    (tmp / TRACKERS_FILE).write_text(json.dumps({"mlflow": {"destination": "x", "run_id": "r"}}))
    sweep_discarded(config)  # what sweep_started wrote goes
    assert not (tmp / TRACKERS_FILE).exists()


@case("trackers.tensorboard.TensorBoardTracker.discard_sweep")
def _tensorboard(tmp: Path) -> None:
    from cprobe.trackers.tensorboard import TensorBoardTracker

    log_dir = tmp / "tb" / "sweep"
    _mine(log_dir / "events.out.tfevents.1.host", "events")
    _mine(log_dir / "notes.txt")
    before = tree(tmp)
    TensorBoardTracker(None).discard_sweep({"log_dir": str(log_dir)})
    assert tree(tmp) == before
    (log_dir / "notes.txt").unlink()
    TensorBoardTracker(None).discard_sweep({"log_dir": str(log_dir)})  # only the events: the parent run goes
    assert not log_dir.exists()


# ----------------------------------------------------------------------------------------------- the cache
def _build(files: dict[str, bytes]) -> Callable[[Path], dict[str, bytes]]:
    return lambda tmp: files


@case("cache.build_lock")
def _build_lock(tmp: Path) -> None:
    from cprobe.cache import build_lock

    _mine(tmp / "e.lock.owner")
    before = tree(tmp)
    with build_lock(tmp / "e.lock", "e"):
        _kept(before, tmp)
    _kept(before, tmp)
    with build_lock(tmp / "f.lock", "f"):
        assert json.loads((tmp / "f.lock.owner").read_text())["pid"] == os.getpid()
    assert not (tmp / "f.lock.owner").exists()


@case("cache._publish")
def _publish(tmp: Path) -> None:
    from cprobe.cache import checked_entry
    from cprobe.errors import CprobeError

    _mine(tmp / "models" / "mine" / "config.json")  # the user's model where an entry would go
    before = tree(tmp)
    with pytest.raises(CprobeError, match=r"mine was not written by cprobe .* move it elsewhere"):
        checked_entry(tmp / "models" / "mine", _build({"w.bin": b"w"}), "e")
    _kept(before, tmp)
    entry, _ = checked_entry(tmp / "models" / "ours", _build({"w.bin": b"w"}), "e")
    entry, hit = checked_entry(entry, _build({"w.bin": b"v"}), "e", rebuild=True)  # cprobe's own entry is replaced
    assert not hit and (entry / "w.bin").read_bytes() == b"v"
    _kept(before, tmp)


@case("cache.checked_entry")
def _stale(tmp: Path) -> None:
    from cprobe.cache import checked_entry

    _mine(tmp / ".e.tmp-notes" / "draft.txt")
    _mine(tmp / ".e.tmp-old.txt")
    (tmp / ".e.tmp-killed.cprobe-tmp").mkdir()  # a killed build's
    before = tree(tmp)
    checked_entry(tmp / "e", _build({"w.bin": b"w"}), "e")
    _kept(before, tmp)
    assert not (tmp / ".e.tmp-killed.cprobe-tmp").exists()


def _acts(root: Path):
    from tests.conftest import write_activations

    return write_activations(root, {"model": "m"}, {"L0": torch.full((4, 3), 1.0)})


@case("cache.Entry.read_shard", "cache.Entry.read")
def _shards(tmp: Path) -> None:
    entry = _acts(tmp)
    shard = next((tmp / "activations").rglob("L0/*.safetensors"))
    _mine(shard.parent.parent / "notes.txt")  # in the entry
    _mine(shard.parent / "notes.txt")  # beside the shard
    shard.write_bytes(shard.read_bytes()[:20])  # torn: deleted, to be computed again
    before = {k: v for k, v in tree(tmp).items() if k.endswith("notes.txt")}
    assert entry.read("L0") is None and not shard.exists()
    _kept(before, tmp)


@case("cache.clear_cache", "cache._clear_activations")
def _clear(tmp: Path) -> None:
    from cprobe.cache import checked_entry, clear_cache
    from cprobe.io import atomic_save_tensors

    entry = _acts(tmp).dir
    checked_entry(tmp / "models" / "tiny", lambda t: {"config.json": b"{}"}, "a model")
    atomic_save_tensors(tmp / "probe_fits" / "p.safetensors", {"w": torch.zeros(2)})
    mine = [_mine(tmp / "activations" / "readme.txt"), _mine(entry / "notes.txt"), _mine(entry / "L0" / "notes.txt"),
            _mine(tmp / "models" / "my-model" / "config.json"), _mine(tmp / "probe_fits" / "p.lock.owner")]
    (tmp / "probe_fits" / "plain.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b'{"a":1} ')  # no cprobe checksums
    mine.append(tmp / "probe_fits" / "plain.safetensors")
    before = tree(tmp)
    before = {k: v for k, v in before.items() if tmp / k in mine}
    n, kept = clear_cache(tmp)
    _kept(before, tmp)
    assert n == 3 and sorted(kept) == sorted(mine)
    assert not (tmp / "models" / "tiny").exists() and not (tmp / "probe_fits" / "p.safetensors").exists()
    assert not (entry / "meta.json").exists() and not list((entry / "L0").glob("*.safetensors"))


# ----------------------------------------------------------------------------------------------- files cprobe writes
@case("io.atomic_write_with")
def _atomic(tmp: Path) -> None:
    from cprobe.io import atomic_write_bytes, atomic_write_with

    _mine(tmp / ".metrics.csv.abcd1234")
    _mine(tmp / ".metrics.csv.abcd1234.cprobe-tmp")
    _mine(tmp / "other.csv")
    before = tree(tmp)

    def torn(f):
        f.write(b"half")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        atomic_write_with(tmp / "metrics.csv", torn)
    assert tree(tmp) == before  # its own temporary gone, nothing else touched
    atomic_write_bytes(tmp / "metrics.csv", b"a,b")
    _kept(before, tmp)
    assert (tmp / "metrics.csv").read_bytes() == b"a,b" and len(tree(tmp)) == len(before) + 1


@case("models.classifier.finetuned_classifier")
def _classifier(tmp: Path) -> None:
    from cprobe.data.items import TextItem
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.classifier import FinetuneConfig, finetuned_classifier
    from tests.conftest import make_word_tokenizer
    from tests.unit.test_family import tiny

    _mine(tmp / "notes.txt")
    _mine(tmp / "t-mine.partial.safetensors")
    before = tree(tmp)
    items = [TextItem(str(i), t) for i, t in enumerate(["the author is here .", "the guards were here", "w1 w2"])]
    enc = ModelAdapter(tiny("bert")[1], make_word_tokenizer("mlm"), "encoder", "t", batch_size=2)
    finetuned_classifier(enc, items, torch.tensor([0, 1, 2]), 1, 3, FinetuneConfig(epochs=1, batch_size=2,
                         max_length=16), 0, tmp, "t", False)
    _kept(before, tmp)
    assert len(list(tmp.glob("t-*.safetensors"))) == 2  # the classifier and the user's file; its checkpoint gone


@case("records.write_records")
def _records(tmp: Path) -> None:
    import pandas as pd

    from cprobe.records import ITEMS_FILE, write_records

    pd.DataFrame({"a": [1], "b": [2]}).to_parquet(tmp / ITEMS_FILE)  # the user's, same name
    before = tree(tmp)
    write_records(pd.DataFrame({"study": ["probing"]}), tmp, None)
    _kept(before, tmp)
    pd.DataFrame({"config_id": ["c"], "metric": ["m"], "item": ["i"], "value": [1.0]}).to_parquet(tmp / ITEMS_FILE)
    write_records(pd.DataFrame({"study": ["probing"]}), tmp, None)  # an earlier run's items: removed
    assert not (tmp / ITEMS_FILE).exists()


@case("models.gguf._joined", "models.gguf.dequantised.build")
def _gguf(tmp: Path) -> None:
    """A user's .gguf (one file, or a package's chunks with a wrong and then the right sha256) is read, never removed
    or changed, whether dequantising fails or succeeds."""
    pytest.importorskip("gguf")
    import hashlib

    from tests.gguf_files import write_llama

    from cprobe.errors import CprobeError
    from cprobe.models import gguf as G

    user = tmp / "mine"
    user.mkdir()
    write_llama(user / "m.gguf")
    blob = (user / "m.gguf").read_bytes()
    for i, (a, b) in enumerate([(0, 1000), (1000, len(blob))]):
        (user / f"m.gguf.part{i}").write_bytes(blob[a:b])
    before = tree(user)
    chunks = (user / "m.gguf.part0", user / "m.gguf.part1")
    with pytest.raises(CprobeError, match="joined chunks"):
        G.dequantised(G.Source("m.gguf", chunks, "0" * 64), tmp / "cache", "test")
    assert tree(user) == before
    G.dequantised(G.Source("m.gguf", chunks, hashlib.sha256(blob).hexdigest()), tmp / "cache", "test")
    G.dequantised(G.Source("m.gguf", (user / "m.gguf",)), tmp / "cache2", "test")
    assert tree(user) == before


@case("outputs.collect")
def _collect(tmp: Path) -> None:
    """A user's own results.csv / report.html in the directory collected into: refused in one line, kept byte for
    byte, nothing left behind; once moved away, collect writes, and a second collect and report rewrite its files."""
    from tests.unit.test_report_html import fake_run

    from cprobe.errors import CprobeError
    from cprobe.outputs import collect
    from cprobe.report import build_report

    fake_run(tmp / "runs" / "a")
    for name in ("results.csv", "report.html"):
        (tmp / name).write_text("the user's\n")
        before = tree(tmp)
        with pytest.raises(CprobeError, match=f"would overwrite {tmp / name}, which cprobe did not write"):
            collect(tmp) if name == "results.csv" else build_report(tmp)
        assert tree(tmp) == before
        (tmp / name).unlink()
    collect(tmp)
    first = tree(tmp)
    assert "results.csv" in first and "report.html" in first and ".cprobe-outputs.json" in first
    collect(tmp)
    build_report(tmp)
    assert set(tree(tmp)) == set(first)


@case("pipeline._run_job")
def _run_job(tmp: Path) -> None:
    _fresh_run(tmp)  # (the user's directories: the bad-input cases below)


@pytest.mark.parametrize("site", sorted(CASES))
def test_a_users_file_survives(site, tmp_path):
    CASES[site](tmp_path)


# ----------------------------------------------------------------------------------------------- the command line
TYPO = "probing.properties=[z_q]"  # the config error
NEEDLE = "unknown property ['z_q']"


def _cli_case(tmp: Path, args: list[str], needle: str, cwd: Path, root: Path | None = None) -> None:
    root = root or cwd
    before = tree(root)
    r = cli("run", "+experiment=sva_tiny", *args, cwd=cwd)
    assert_refused(r, needle)
    assert tree(root) == before and root.is_dir()


def _notes(tmp: Path) -> Path:
    work = tmp / "work"
    _mine(work / "notes.txt")
    return work


BAD = {
    # a run into the working directory holding the user's notes: refused before Hydra writes .hydra/ or cprobe.log
    "run-dir-holds-user-files": lambda tmp: _cli_case(tmp, [TYPO, "hydra.run.dir=."],
                                                      "hydra.run.dir=. (", cwd=_notes(tmp)),
    "run-dir-holds-user-files-and-no-typo": lambda tmp: _cli_case(tmp, ["hydra.run.dir=."], "holds files cprobe did "
                                                                  "not write (notes.txt)", cwd=_notes(tmp)),
    "sweep-dir-holds-user-files": lambda tmp: _cli_case(tmp, ["-m", "layers=3,4", "hydra.sweep.dir=."],
                                                        "hydra.sweep.dir=. (", cwd=_notes(tmp)),
    "slurm-sweep-dir-holds-user-files": lambda tmp: _cli_case(tmp, ["-m", "layers=3,4", "hydra/launcher=slurm",
                                                                    "hydra.sweep.dir=."], "hydra.sweep.dir=. (",
                                                              cwd=_notes(tmp)),
}


def _empty_working_dir(tmp: Path) -> None:
    """The user's empty working directory as the run dir: the config error leaves it, empty."""
    (tmp / "work").mkdir()
    _cli_case(tmp, [TYPO, "hydra.run.dir=."], NEEDLE, cwd=tmp / "work", root=tmp)


def _below_empty_working_dir(tmp: Path) -> None:
    """``hydra.run.dir=DIR/r``, DIR the user's empty working directory: r goes, DIR stays."""
    work = tmp / "work"
    work.mkdir()
    _mine(tmp / "beside.txt")
    _cli_case(tmp, [TYPO, f"hydra.run.dir={work}/r"], NEEDLE, cwd=work, root=tmp)


def _earlier_run(tmp: Path) -> None:
    """A finished cprobe run (its status.json, record and log) holding a file of the user's: a failed start there (the
    issue's ``layers=[99]`` without ``force``) leaves every file of it as it was, so it still reads as done."""
    from cprobe.job import write_status

    run = tmp / "run"
    write_status(run, state="done", started=0.0, config_hash="x", task="probing")
    _mine(run / ".hydra" / "hydra.yaml", _HYDRA.format(ownership.CALLBACK))
    _mine(run / ".hydra" / "config.yaml", "layers: [2]\n")
    _mine(run / ".hydra" / "overrides.yaml", "- layers=[2]\n")
    _mine(run / "cprobe.log", "[INFO] wrote metrics.csv\n")
    _mine(run / "metrics.csv", "layer,accuracy\n2,0.9\n")
    _mine(run / "notes.txt")
    before = tree(tmp)
    r = cli("run", "+experiment=sva_tiny", "layers=[99]", f"hydra.run.dir={run}", cwd=tmp)
    assert_refused(r, "layers=[99] out of range")
    assert tree(tmp) == before and json.loads((run / "status.json").read_text())["state"] == "done"


def _fresh_run(tmp: Path) -> None:
    """A fresh time-stamped run: its directory goes, ``latest`` points back at the run it named before."""
    old = tmp / "out" / "runs" / "sva_tiny" / "old"
    old.mkdir(parents=True)
    (old.parent / LATEST).symlink_to("old")
    before = tree(tmp)
    r = cli("run", "+experiment=sva_tiny", TYPO, f"paths.output_root={tmp / 'out'}", cwd=tmp)
    assert_refused(r, NEEDLE)
    assert tree(tmp) == before and sorted(p.name for p in old.parent.iterdir()) == [LATEST, "old"]


def _offload_dir(tmp: Path) -> None:
    offload = _mine(tmp / "offload" / "notes.txt").parent
    (tmp / "work").mkdir()
    _cli_case(tmp, ["compute=cpu", "model.device_map=auto", "model.max_memory={cpu: 2MB}",
                    f"model.offload_dir={offload}"], "holds files an offload did not write (notes.txt)",
              cwd=tmp / "work", root=tmp)


def _cache_clear(tmp: Path) -> None:
    """`cprobe cache clear` with CPROBE_CACHE_DIR on a directory cprobe never wrote: nothing is removed, the files
    kept are reported (not an error: exit 0)."""
    _mine(tmp / "activations" / "readme.txt")
    before = tree(tmp)
    r = cli("cache", "clear", "activations", "--yes", env={"CPROBE_CACHE_DIR": str(tmp)})
    assert r.returncode == 0 and "removed 0 entries" in r.stdout
    assert "kept 1 file(s) cprobe did not write: activations/readme.txt" in r.stdout
    assert tree(tmp) == before


def _job_folder(*launcher: str) -> Callable[[Path], None]:
    """A folder of the user's, with their own metrics.csv, where a sweep's job would write (``layers=3`` in an earlier
    cprobe sweep): refused in one line before the batch starts — no job ran — and the user's files kept."""
    def check(tmp: Path) -> None:
        sweep = tmp / "sweep"
        _mine(sweep / "multirun.yaml", "name: x\n" + _HYDRA.format(ownership.CALLBACK))  # an earlier sweep's
        _mine(sweep / "layers=3" / "metrics.csv", "layer,accuracy\n3,0.5\n")
        _mine(sweep / "layers=3" / "notes.txt")
        before = tree(tmp)
        r = cli("run", "-m", "+experiment=sva_tiny", "layers=2,3", *launcher, f"hydra.sweep.dir={sweep}", cwd=tmp)
        assert_refused(r, f"the sweep's job folder {sweep / 'layers=3'} holds files cprobe did not write "
                          "(metrics.csv, notes.txt)")
        assert tree(sweep / "layers=3") == {k.removeprefix("sweep/layers=3/"): v for k, v in before.items()
                                             if k.startswith("sweep/layers=3/")}
        assert not (sweep / "layers=2").exists()  # (Hydra rewrote the sweep's own multirun.yaml before its check)
    return check


def _search_job_folder(tmp: Path) -> None:
    """The same in a search (``hparams_search=probing``, one trial): a folder of the user's at every name the trial may
    get; refused before the trial runs, the user's files kept."""
    sweep = tmp / "sweep"
    _mine(sweep / "multirun.yaml", "name: x\n" + _HYDRA.format(ownership.CALLBACK))
    for batch in (32, 64, 128):
        for epochs in range(2, 17):  # the preset's space
            _mine(sweep / f"probe.mlp.batch_size={batch},probe.mlp.epochs={epochs},probe=mlp" / "metrics.csv")
    before = tree(sweep)
    r = cli("run", "-m", "+experiment=sva_tiny", "probe=mlp", "hparams_search=probing", "hydra.sweeper.n_trials=1",
            f"hydra.sweep.dir={sweep}", cwd=tmp)
    last = r.stderr.strip().splitlines()[-1]  # (after the search's opening line)
    assert r.returncode == 1 and last.startswith(f"error: the sweep's job folder {sweep}/probe.mlp.batch_size="), \
        r.stderr[-2000:]
    _kept({k: v for k, v in before.items() if k != "multirun.yaml"}, sweep)
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith("probe.")) == ["multirun.yaml"]


BAD.update({"job-folder-holds-user-files": _job_folder(), "job-folder-holds-user-files-search": _search_job_folder,
            "job-folder-holds-user-files-joblib": _job_folder("hydra/launcher=local_parallel")})
BAD.update({"empty-working-dir": _empty_working_dir, "below-empty-working-dir": _below_empty_working_dir,
            "earlier-cprobe-run": _earlier_run,
            "offload-dir-holds-user-files": _offload_dir, "cache-clear-foreign-dir": _cache_clear})


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_keeps_the_users_files(name, tmp_path):
    BAD[name](tmp_path)


def test_a_slurm_sweep_s_job_folder_of_the_user_s_is_refused_before_anything_is_submitted(tmp_path, monkeypatch):
    """The SLURM driver on a cluster that accepts the request (faked): the user's folder where a point would write is
    refused in one line before any submission, the user's files kept."""
    from cprobe import slurmctl

    monkeypatch.setattr(slurmctl, "available", lambda: True)
    cpu = slurmctl.parse_partitions("cpu*|up|1-00:00:00|4|32|128000|(null)\n")
    monkeypatch.setattr(slurmctl, "partitions", lambda: cpu)
    monkeypatch.setattr(slurmctl, "test_submit", lambda flags: None)
    monkeypatch.setattr(slurmctl, "run", lambda *a, **k: pytest.fail("nothing may reach the scheduler"))
    _job_folder("hydra/launcher=slurm")(tmp_path)
    assert not (tmp_path / "sweep" / ".slurm").exists()


# ----------------------------------------------------------------------------------------------- scripts/
SCRIPT_SITES = {
    "scripts.bench_cache.main": "removes its own mkdtemp root and the entries it wrote there",
    "scripts.bench_gguf.main": "removes the baseline's model folder inside its own TemporaryDirectory",
    "scripts.bench_slurm.main": "removes its own mkdtemp root (kept with --keep)",
    "scripts.bench_stream_fit.main": "removes its own mkdtemp root",
}
"""Every deletion, move or rename in ``scripts/`` and why it is safe (what the scripts write is below)."""


def test_every_deletion_site_in_scripts_is_audited():
    assert deletion_sites(REPO / "scripts", "scripts.") == set(SCRIPT_SITES)
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert not [s for s in SCRIPT_SITES if f"`{s}`" not in doc], "docs/architecture.md lists every site"


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ravel_temporary_name(tmp: Path) -> None:
    """The user's own ``ravel_city_entity_attributes.json.tmp`` (the name the writer once used as its temporary):
    kept byte for byte, and nothing is left beside the two files."""
    _mine(tmp / "ravel_city_entity_attributes.json.tmp")
    before = tree(tmp)
    written = _script("ravel_cities").write(tmp)
    _kept(before, tmp)
    assert sorted(tree(tmp)) == sorted([*before, *(p.name for p in written)])


def _ravel_second_name_taken(tmp: Path) -> None:
    """Only the second output name holds other data: refused in one line, the first file not written either."""
    _mine(tmp / "ravel_city_attribute_to_prompts.json", "{}")
    before = tree(tmp)
    with pytest.raises(SystemExit, match=r"^error: \S+ravel_city_attribute_to_prompts.json exists and holds other "
                                         "data") as refused:
        _script("ravel_cities").write(tmp)
    assert tree(tmp) == before and "; nothing was written: pick another folder" in str(refused.value)


def _bench_sae(tmp: Path, *args: str, work: bool = True) -> None:
    """``scripts/bench_sae.py synthetic`` at a toy size with ``args`` (``work=False``: drawing states or training
    fails the test)."""
    import sys
    from unittest import mock

    bench = _script("bench_sae")
    if not work:
        bench.planted = bench.train = lambda *a, **k: pytest.fail("refused only after the work")
    argv = ["bench_sae.py", "synthetic", "--n", "256", "--d", "8", "--d-sae", "16", "--k", "2", "--epochs", "1",
            "--batch-size", "64", *args]
    with mock.patch.object(sys, "argv", argv):
        bench.main()


def _sae_folder_of_the_user(tmp: Path) -> None:
    """A user's SAE (SAELens's cfg.json and weights) as ``--save DIR``: refused in one line before any training, with
    or without ``--force``; an existing ``--out`` file too."""
    from safetensors.torch import save_file

    sae = tmp / "their_sae"
    _mine(sae / "cfg.json", '{"d_in": 8, "d_sae": 16}')
    save_file({"W_enc": torch.ones(8, 16)}, str(sae / "sae_weights.safetensors"))
    _mine(tmp / "states.safetensors")
    before = tree(tmp)
    for force in ((), ("--force",)):
        with pytest.raises(SystemExit, match=rf"^error: --save {re.escape(str(sae))} is not a new or empty folder "
                                             r"\(it holds cfg.json, sae_weights.safetensors\); "):
            _bench_sae(tmp, "--save", str(sae), *force, work=False)
        with pytest.raises(SystemExit, match=r"^error: --out \S+states.safetensors exists; pick another file"):
            _bench_sae(tmp, "--out", str(tmp / "states.safetensors"), *force, work=False)
    assert tree(tmp) == before


def _sae_folder_of_its_own(tmp: Path) -> None:
    """Its own SAE: a rerun asks for ``--force``, which replaces it; once the user edits a file of it, or puts one of
    their own beside it, ``--force`` refuses too."""
    from cprobe.sae import saelens

    sae = tmp / "sae"
    _bench_sae(tmp, "--save", str(sae))
    with pytest.raises(SystemExit, match="pick another folder, or --force to replace an SAE this script saved"):
        _bench_sae(tmp, "--save", str(sae), work=False)
    _bench_sae(tmp, "--save", str(sae), "--force")
    assert saelens.load(sae).d_sae == 16 and sorted(p.name for p in sae.iterdir()) == [
        "cfg.json", "checksums.json", "sae_weights.safetensors"]
    for theirs in (sae / "notes.txt", sae / "cfg.json"):
        _mine(theirs, '{"mine": true}')
        before = tree(tmp)
        with pytest.raises(SystemExit, match="--force replaces only an SAE this script saved there, unchanged since"):
            _bench_sae(tmp, "--save", str(sae), "--force", work=False)
        assert tree(tmp) == before
        if theirs.name == "notes.txt":
            theirs.unlink()


SCRIPTS = {"ravel-cities-temporary-name": _ravel_temporary_name, "ravel-cities-second-name-taken":
           _ravel_second_name_taken, "bench-sae-user-folder": _sae_folder_of_the_user,
           "bench-sae-own-folder": _sae_folder_of_its_own}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_keeps_the_users_files(name, tmp_path):
    SCRIPTS[name](tmp_path)
