#!/usr/bin/env python
"""A small mutation-testing harness: one-line AST mutations of a source file, each run against a targeted test
selection, reporting which mutants the tests kill and which survive (file:line). Not part of ``make test``.

    python scripts/mutation.py --file src/cprobe/leaderboard.py                 # the file's default tests (TESTS)
    python scripts/mutation.py --file src/cprobe/records.py --tests tests/unit/test_records.py
    python scripts/mutation.py --file src/cprobe/tasks/reliability.py --function read_layers,run
    python scripts/mutation.py --file src/cprobe/leaderboard.py --lines 60-100 --list   # the mutants, not run
    python scripts/mutation.py --file src/cprobe/leaderboard.py --replace '123:finite.mean()=>np.median(finite)'

Mutations (``--ops`` picks some): ``binop`` (+ ↔ −, * ↔ /, // → /, % → *, ** → *), ``compare`` (< ↔ <=, > ↔ >=,
== ↔ !=, in ↔ not in, is ↔ is not), ``boolop`` (and ↔ or), ``not`` (a dropped ``not``, unary ``-`` or ``~``),
``const`` (an int ±1, True ↔ False), ``name`` (argmax ↔ argmin, max ↔ min, mean ↔ median, nanmean ↔ nanmedian,
idxmax ↔ idxmin, any ↔ all, isna ↔ notna, ceil ↔ floor, ... as the called function or method), ``args`` (two
neighbouring positional arguments swapped; with four, the halves swapped), ``ifexp`` (the branches of ``a if c else b``
swapped), ``augassign`` (+= ↔ −=, *= ↔ /=), ``delete`` (a re-assignment of a local name dropped).
Docstrings, f-strings, annotations, log / warning calls and ``raise`` statements are not mutated: they change no
number.

How it runs: the parent imports the heavy third-party libraries once, then forks one child per mutant; the child
installs an import hook that serves the mutated source under the module's real name and path (the file on disk is
never touched) and runs pytest in-process on the selected tests with ``-x``. Exit status 0 = the mutant survived;
failures, errors and timeouts kill it. A baseline run on the unmutated source must pass first; the timeout is a
multiple of its time. POSIX only (fork).
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.util
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TESTS: dict[str, list[str]] = {
    "src/cprobe/interventions/direction.py": [
        "tests/unit/test_fidelity_mutants.py", "tests/unit/test_fidelity_direction.py",
        "tests/unit/test_fidelity_along.py", "tests/unit/test_fidelity_kind.py", "tests/unit/test_direction_intervention.py"],
    "src/cprobe/tasks/causalgym_engine.py": [
        "tests/integration/test_fidelity_causalgym.py", "tests/integration/test_peer_check.py",
        "tests/integration/test_causalgym_interventions.py"],
    "src/cprobe/models/multisite.py": [
        "tests/unit/test_sites_engine.py", "tests/unit/test_resume_kv.py", "tests/integration/test_fidelity_causalgym.py",
        "tests/integration/test_causalgym_interventions.py", "tests/integration/test_sites_golden.py"],
    "src/cprobe/tasks/reliability.py": [
        "tests/integration/test_fidelity_read_layers.py", "tests/unit/test_fidelity_caches.py",
        "tests/unit/test_fidelity_mutants.py", "tests/unit/test_fidelity_kind.py", "tests/unit/test_read_layers.py"],
    "src/cprobe/leaderboard.py": ["tests/unit/test_fidelity_leaderboard.py", "tests/unit/test_fidelity_mutants.py",
                                  "tests/unit/test_leaderboard.py"],
    "src/cprobe/records.py": ["tests/unit/test_fidelity_records.py", "tests/unit/test_fidelity_mutants.py",
                              "tests/unit/test_records.py"],
    "src/cprobe/models/head.py": ["tests/unit/test_head.py"],
    "src/cprobe/directions/lda.py": ["tests/unit/test_directions.py"],
}
"""The targeted test selection per file (``--tests`` replaces it)."""

PRELOAD = ("numpy", "pandas", "torch", "scipy.stats", "sklearn.linear_model", "sklearn.discriminant_analysis",
           "transformers", "transformers.models.bert.modeling_bert", "transformers.models.gpt_neox.modeling_gpt_neox",
           "hydra", "omegaconf", "safetensors.torch", "pyarrow", "pytest")
"""Imported once in the parent (no computation: forking after it is safe), so a child starts in ~1 s."""

BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
          ast.Mod: ast.Mult, ast.Pow: ast.Mult}
CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
          ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
OPTEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
          ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
          ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
          ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>"}
NAMES = {"argmax": "argmin", "argmin": "argmax", "max": "min", "min": "max", "maximum": "minimum",
         "minimum": "maximum", "mean": "median", "median": "mean", "nanmean": "nanmedian", "nanmedian": "nanmean",
         "nanmax": "nanmin", "nanmin": "nanmax", "amax": "amin", "amin": "amax", "idxmax": "idxmin",
         "idxmin": "idxmax", "any": "all", "all": "any", "isna": "notna", "notna": "isna", "isnull": "notnull",
         "notnull": "isnull", "ceil": "floor", "floor": "ceil", "nlargest": "nsmallest", "nsmallest": "nlargest",
         "cummax": "cummin", "cummin": "cummax", "nansum": "nanmean", "sum": "mean"}
OPS = ("binop", "compare", "boolop", "not", "const", "name", "args", "ifexp", "augassign", "delete")
QUIET_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "echo", "write_line"}


@dataclass
class Mutant:
    line: int
    op: str
    before: str
    after: str
    start: int  # byte offsets of the replaced span
    end: int
    status: str = ""
    seconds: float = 0.0

    def where(self, path: str) -> str:
        return f"{path}:{self.line}"


# ----------------------------------------------------------------------------------------------- finding mutants
class _Finder:
    def __init__(self, src: bytes, tree: ast.Module, ops: set[str], lines: set[int] | None) -> None:
        self.src, self.ops, self.lines = src, ops, lines
        self.starts = [0]
        for line in src.split(b"\n"):
            self.starts.append(self.starts[-1] + len(line) + 1)
        self.skip: set[int] = set()
        self.out: list[Mutant] = []
        self._mark_skipped(tree)
        self._visit(tree, [])

    def off(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def seg(self, node: ast.AST) -> str:
        return self.src[self.off(node.lineno, node.col_offset):self.off(node.end_lineno, node.end_col_offset)].decode()

    def _mark_skipped(self, tree: ast.AST) -> None:
        """Nodes that change no number: docstrings, f-strings, annotations, log/warn calls, raise statements."""
        def skip_all(n: ast.AST | None) -> None:
            if n is not None:
                self.skip.update(id(x) for x in ast.walk(n))

        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                body = n.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                        and isinstance(body[0].value.value, str):
                    skip_all(body[0])
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    skip_all(n.returns)
                    for a in [*n.args.args, *n.args.kwonlyargs, *n.args.posonlyargs, n.args.vararg, n.args.kwarg]:
                        if a is not None:
                            skip_all(a.annotation)
            elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
                skip_all(n)  # attribute docstrings
            elif isinstance(n, ast.AnnAssign):
                skip_all(n.annotation)
            elif isinstance(n, (ast.JoinedStr, ast.Raise)):
                skip_all(n)
            elif isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in QUIET_CALLS:
                    skip_all(n)
            elif isinstance(n, ast.Assert):
                skip_all(n.msg)

    def add(self, node: ast.AST, op: str, after: str, line: int | None = None) -> None:
        if op not in self.ops or id(node) in self.skip:
            return
        line = line or node.lineno
        if self.lines is not None and line not in self.lines:
            return
        before = self.seg(node)
        if after == before:
            return
        self.out.append(Mutant(line, op, before, after, self.off(node.lineno, node.col_offset),
                               self.off(node.end_lineno, node.end_col_offset)))

    def _visit(self, node: ast.AST, assigned: list[set[str]]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = {a.arg for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]}
            assigned = [*assigned, names]
        self._mutate(node, assigned)
        for child in ast.iter_child_nodes(node):
            self._visit(child, assigned)

    def _mutate(self, n: ast.AST, assigned: list[set[str]]) -> None:
        s = self.seg
        if isinstance(n, ast.BinOp) and type(n.op) in BINOPS:
            self.add(n, "binop", f"(({s(n.left)}) {OPTEXT[BINOPS[type(n.op)]]} ({s(n.right)}))")
        elif isinstance(n, ast.Compare):
            for i, op in enumerate(n.ops):
                if type(op) not in CMPOPS:
                    continue
                parts = [f"({s(n.left)})"]
                for j, (o, c) in enumerate(zip(n.ops, n.comparators)):
                    parts += [OPTEXT[CMPOPS[type(o)]] if j == i else OPTEXT[type(o)], f"({s(c)})"]
                self.add(n, "compare", "(" + " ".join(parts) + ")")
        elif isinstance(n, ast.BoolOp):
            other = " or " if isinstance(n.op, ast.And) else " and "
            self.add(n, "boolop", "(" + other.join(f"({s(v)})" for v in n.values) + ")")
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Not, ast.USub, ast.Invert)):
            self.add(n, "not", f"({s(n.operand)})")
        elif isinstance(n, ast.Constant):
            if isinstance(n.value, bool):
                self.add(n, "const", str(not n.value))
            elif isinstance(n.value, int):
                self.add(n, "const", f"({n.value + 1})")
                self.add(n, "const", f"({n.value - 1})")
        elif isinstance(n, ast.Call):
            self._call(n)
        elif isinstance(n, ast.IfExp):
            self.add(n, "ifexp", f"(({s(n.orelse)}) if ({s(n.test)}) else ({s(n.body)}))")
        elif isinstance(n, ast.AugAssign) and type(n.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            new = {ast.Add: "-=", ast.Sub: "+=", ast.Mult: "/=", ast.Div: "*="}[type(n.op)]
            self.add(n, "augassign", f"{s(n.target)} {new} {s(n.value)}")
        if isinstance(n, ast.Assign) and assigned and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and n.lineno == n.end_lineno:
            name = n.targets[0].id
            if name in assigned[-1]:
                self.add(n, "delete", "pass")
            assigned[-1].add(name)

    def _call(self, n: ast.Call) -> None:
        s, f = self.seg, n.func
        if isinstance(f, ast.Attribute) and f.attr in NAMES:
            value = s(f.value)  # a parenthesised receiver's segment omits its parentheses: keep the precedence
            receiver = value if re.fullmatch(r"[\w.]+", value) else f"({value})"
            self.add(f, "name", f"{receiver}.{NAMES[f.attr]}")
        elif isinstance(f, ast.Name) and f.id in NAMES and f.id not in ("sum", "any", "all"):
            self.add(f, "name", NAMES[f.id])
        args = n.args
        if len(args) < 2 or any(isinstance(a, ast.Starred) for a in args):
            return
        rest = [s(k) for k in n.keywords]

        def call(new_args: list[ast.AST]) -> str:
            return f"{s(f)}(" + ", ".join([*(s(a) for a in new_args), *rest]) + ")"

        for i in range(len(args) - 1):
            swapped = [*args[:i], args[i + 1], args[i], *args[i + 2:]]
            self.add(n, "args", call(swapped))
        if len(args) == 4:
            self.add(n, "args", call([args[2], args[3], args[0], args[1]]))


def find_mutants(path: Path, ops: set[str], lines: set[int] | None) -> list[Mutant]:
    src = path.read_bytes()
    out = _Finder(src, ast.parse(src), ops, lines).out
    good = []
    for m in out:
        try:
            compile(apply(src, m), str(path), "exec")
        except SyntaxError:
            continue
        good.append(m)
    return sorted(good, key=lambda m: (m.start, m.op, m.after))


def apply(src: bytes, m: Mutant) -> bytes:
    return src[:m.start] + m.after.encode() + src[m.end:]


def custom_mutants(path: Path, specs: list[str]) -> list[Mutant]:
    """Hand-written mutants ``LINE:OLD=>NEW``: the first ``OLD`` on line ``LINE`` replaced by ``NEW``."""
    src = path.read_bytes()
    starts = [0]
    for line in src.split(b"\n"):
        starts.append(starts[-1] + len(line) + 1)
    out = []
    for spec in specs:
        where, _, rest = spec.partition(":")
        old, sep, new = rest.partition("=>")
        if not sep or not where.isdigit():
            sys.exit(f"--replace {spec!r}: use LINE:OLD=>NEW")
        line = int(where)
        text = src[starts[line - 1]:starts[line] - 1]
        at = text.find(old.encode())
        if at < 0:
            sys.exit(f"--replace {spec!r}: {old!r} is not on line {line} ({text.decode().strip()!r})")
        out.append(Mutant(line, "custom", old, new, starts[line - 1] + at, starts[line - 1] + at + len(old.encode())))
    return out


def function_lines(path: Path, names: list[str]) -> set[int]:
    tree = ast.parse(path.read_bytes())
    out: set[int] = set()
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name in names:
            out.update(range(n.lineno, n.end_lineno + 1))
            found.add(n.name)
    missing = sorted(set(names) - found)
    if missing:
        sys.exit(f"no function or class {missing} in {path}")
    return out


# ----------------------------------------------------------------------------------------------- running
class _Serve(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``source`` as module ``name`` (compiled with the real file name, so tracebacks point at it)."""

    def __init__(self, name: str, path: Path, source: bytes) -> None:
        self.name, self.path, self.source = name, path, source

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(self.source, str(self.path), "exec"), module.__dict__)


def module_name(path: Path) -> str:
    rel = path.resolve().relative_to(REPO / "src").with_suffix("")
    return ".".join(rel.parts)


def run_child(module: str, path: Path, source: bytes | None, tests: list[str], pytest_args: list[str],
              timeout: float, log: Path | None, threads: int = 1) -> tuple[str, float]:
    """(status, seconds): ``survived`` (tests pass), ``killed`` (a failure or an error), ``timeout``."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setpgid(0, 0)
            fd = os.open(str(log) if log else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            if threads:
                import torch

                torch.set_num_threads(threads)
            if source is not None:
                sys.meta_path.insert(0, _Serve(module, path, source))
            import pytest

            code = int(pytest.main([*tests, "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-W", "ignore",
                                    *pytest_args]))
        finally:
            os._exit(code)
    deadline = t0 + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.perf_counter() - t0
        time.sleep(0.05)
    code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if code == 0:
        return "survived", seconds
    if code == 5:
        return "no-tests", seconds
    return "killed", seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--file", required=True, help="the source file to mutate (under src/)")
    ap.add_argument("--tests", nargs="+", help="test files or node ids (default: the file's entry in TESTS)")
    ap.add_argument("--function", help="comma-separated functions/classes whose lines are mutated (default: all)")
    ap.add_argument("--lines", help="a line range a-b (combined with --function: both)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"mutation kinds, comma-separated (default: all of {OPS})")
    ap.add_argument("--replace", action="append", default=[],
                    help="a hand-written mutant LINE:OLD=>NEW (repeatable; then only these run)")
    ap.add_argument("--survivors", help="rerun only the survivors recorded in this --json file of an earlier run "
                                        "(those whose source text is unchanged)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression for the selection")
    ap.add_argument("--timeout-factor", type=float, default=4.0, help="timeout = factor x baseline (min 30 s)")
    ap.add_argument("--max", type=int, default=0, help="run at most this many mutants (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each run (0: torch's default)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--json", help="write every mutant's result to this file")
    ap.add_argument("--log-dir", help="keep each run's pytest output here (default: discarded)")
    a = ap.parse_args(argv)

    path = (REPO / a.file).resolve() if not Path(a.file).is_absolute() else Path(a.file)
    rel = str(path.relative_to(REPO))
    tests = a.tests or TESTS.get(rel)
    if not tests:
        sys.exit(f"no default tests for {rel}: pass --tests")
    ops = set(a.ops.split(","))
    bad = sorted(ops - set(OPS))
    if bad:
        sys.exit(f"unknown mutation kind(s) {bad}; choose from {list(OPS)}")
    lines: set[int] | None = None
    if a.function:
        lines = function_lines(path, a.function.split(","))
    if a.lines:
        lo, hi = (int(x) for x in a.lines.split("-"))
        rng = set(range(lo, hi + 1))
        lines = rng if lines is None else lines & rng
    mutants = custom_mutants(path, a.replace) if a.replace else find_mutants(path, ops, lines)
    if a.survivors:
        old = [m for m in json.loads(Path(a.survivors).read_text())["mutants"] if m["status"] == "survived"]
        src_now = path.read_bytes()
        keep = []
        for m in old:
            if src_now[m["start"]:m["end"]].decode(errors="replace") == m["before"]:
                keep.append(Mutant(m["line"], m["op"], m["before"], m["after"], m["start"], m["end"]))
            else:
                print(f"skipped (source changed): {rel}:{m['line']} {m['op']}: {m['before'][:50]}")
        mutants = keep
    if a.max:
        mutants = mutants[:a.max]
    if a.list:
        for m in mutants:
            print(f"{m.where(rel)}  {m.op:<9} {m.before.splitlines()[0][:60]!s}  ->  {m.after.splitlines()[0][:60]}")
        print(f"{len(mutants)} mutants")
        return 0

    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    pytest_args = ["-k", a.keyword] if a.keyword else []
    log_dir = Path(a.log_dir) if a.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    module = module_name(path)
    src = path.read_bytes()
    status, base_s = run_child(module, path, None, tests, pytest_args, 3600,
                               log_dir / "baseline.log" if log_dir else None, a.threads)
    if status != "survived":
        sys.exit(f"the baseline run of {tests} does not pass ({status}); fix it before mutating")
    timeout = max(30.0, a.timeout_factor * base_s)
    print(f"{rel}: {len(mutants)} mutants; tests {' '.join(tests)} (baseline {base_s:.1f}s, timeout {timeout:.0f}s)",
          flush=True)
    for i, m in enumerate(mutants, 1):
        log = log_dir / f"mutant_{i:04d}.log" if log_dir else None
        m.status, m.seconds = run_child(module, path, apply(src, m), tests, pytest_args, timeout, log, a.threads)
        mark = "SURVIVED" if m.status == "survived" else m.status
        print(f"[{i}/{len(mutants)}] {mark:<8} {m.where(rel)} {m.op}: {m.before.splitlines()[0][:50]} -> "
              f"{m.after.splitlines()[0][:50]} ({m.seconds:.1f}s)", flush=True)
    killed = [m for m in mutants if m.status in ("killed", "timeout")]
    survivors = [m for m in mutants if m.status == "survived"]
    print(f"\n{rel}: killed {len(killed)}/{len(mutants)}")
    for m in survivors:
        print(f"  survived {m.where(rel)} {m.op}: {m.before.splitlines()[0][:70]} -> {m.after.splitlines()[0][:70]}")
    if a.json:
        Path(a.json).write_text(json.dumps({"file": rel, "tests": tests, "baseline_s": base_s,
                                            "killed": len(killed), "total": len(mutants),
                                            "mutants": [asdict(m) for m in mutants]}, indent=1))
    return 0


def _iter(path: Path) -> Iterator[Mutant]:  # pragma: no cover - convenience for interactive use
    yield from find_mutants(path, set(OPS), None)


if __name__ == "__main__":
    raise SystemExit(main())
