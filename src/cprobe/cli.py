"""The ``cprobe`` command line (Typer). Heavy imports (torch, transformers, hydra) stay inside commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated

import typer

from cprobe import __version__
from cprobe.errors import CprobeError, DriverStopped, JobAborted, Terminated

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="cprobe: config-driven causal probing of language models.",
)
cache_app = typer.Typer(no_args_is_help=True, help="Inspect or clear the activation/model cache.")
app.add_typer(cache_app, name="cache")
mib_app = typer.Typer(help="MIB's causal variable track format (docs/mib.md).", no_args_is_help=True)
app.add_typer(mib_app, name="mib")


@app.callback()
def _main(
    no_plugins: Annotated[bool, typer.Option("--no-plugins", help="Ignore installed plugins (entry points); also "
                                             "CPROBE_NO_PLUGINS=1.")] = False,
) -> None:
    """cprobe: config-driven causal probing of language models."""
    if no_plugins:
        os.environ["CPROBE_NO_PLUGINS"] = "1"  # inherited by launcher workers


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn known failures into one actionable line and exit 1 (CPROBE_DEBUG=1 shows tracebacks)."""
    if os.environ.get("CPROBE_DEBUG"):
        yield
        return
    try:
        yield
    except typer.Exit:
        raise
    except JobAborted as e:
        _fail(_one_line(str(e.error)))
    except DriverStopped as e:  # a SLURM sweep's driver: its jobs go on
        typer.secho(e.message, fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(e.code) from None
    except CprobeError as e:
        _fail(_one_line(str(e)))
    except KeyboardInterrupt as e:  # Ctrl-C: 130; SIGTERM (errors.Terminated): 143, as the shells report them
        signal = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        typer.secho(f"interrupted by {signal} (status.json of the running job says so; rerun the same command to "
                    "resume)", fg=typer.colors.RED, err=True)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    except BrokenPipeError:  # `cprobe list | head`
        sys.stderr.close()
        raise typer.Exit(0) from None
    except Exception as e:  # Hydra/OmegaConf config errors and the like
        from cprobe._hydra import explain_error
        from cprobe.errors import cprobe_cause, one_line

        cause = cprobe_cause(e)  # raised in a plugin Hydra instantiates, re-raised in its words
        if cause is not None:
            _fail(_one_line(str(cause)))
        hydra_msg = explain_error(e)
        if hydra_msg is not None:
            _fail(hydra_msg if "cprobe list" in hydra_msg or "--cfg job" in hydra_msg
                  else hydra_msg + " (see `cprobe list` and `cprobe run --cfg job`)")
        _fail(f"{type(e).__name__}: {one_line(e)} (rerun with CPROBE_DEBUG=1 for the traceback)")


SMOKE_ENV = "CPROBE_SMOKE"


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help=(
        "Run an experiment; every Hydra override and flag passes through: "
        "`cprobe run +experiment=sva_tiny`, `cprobe run -m +experiment=sva_tiny probe=linear,mlp`, "
        "`--cfg job`, `--info`, `hydra/launcher=local_parallel`. A bare `experiment=x` means `+experiment=x`."
    ),
)
def run(
    ctx: typer.Context,
    smoke: Annotated[bool, typer.Option("--smoke", help="Append +debug=smoke (tiny sizes, for CI); "
                                        f"also set by the environment variable {SMOKE_ENV}=1.")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="With --cfg: print the config as composed, interpolations "
                                      "such as ${compute.device} unresolved (by default they are resolved).")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="With hydra/launcher=slurm: return once the sweep is "
                                         "submitted (it prints the sweep dir and job id); follow it with `cprobe "
                                         "status DIR`, aggregate it with `cprobe collect DIR`.")] = False,
) -> None:
    from cprobe import _hydra
    from cprobe.paths import config_dir, environ

    if not ctx.args and not smoke:
        typer.echo(ctx.get_help())
        typer.echo("\nnothing to run: pick an experiment, e.g. `cprobe run +experiment=sva_tiny` "
                   "(`cprobe list experiment` shows them)", err=True)
        raise typer.Exit(2)
    argv, notes = _hydra.normalise(ctx.args, resolve=not raw)
    for n in notes:
        typer.echo(n, err=True)
    if (smoke or os.environ.get(SMOKE_ENV, "") not in ("", "0")) and "+debug=smoke" not in argv:
        argv.append("+debug=smoke")
    # --detach: CPROBE_DETACH=1 while the command runs (the SLURM launcher reads it; the sweep callback refuses it
    # on any other launcher)
    with user_errors(), environ(CPROBE_DETACH="1") if detach else nullcontext():
        from cprobe import callbacks, pipeline  # noqa: F401  (pipeline registers the config resolvers)

        os.environ["HYDRA_FULL_ERROR"] = "1"  # let errors reach user_errors() instead of Hydra's printer
        callbacks.reset()
        _hydra.run(argv, pipeline.run_job, str(config_dir()))
        if callbacks.FAILED or callbacks.REPORT_FAILED:
            from cprobe.job import failure_line

            _fail(failure_line(callbacks.FAILED, callbacks.REPORT_FAILED))


@app.command("list", help="List config options (experiments, models, datasets, probes, interventions, ...), or "
             "`cprobe list metrics`: every metric the studies record, its direction, range and reference.")
def list_(group: Annotated[str | None, typer.Argument(help="Config group, e.g. model; or metrics.")] = None) -> None:
    from cprobe.catalog import describe_group, groups

    with user_errors():
        if group == "metrics":
            _list_metrics()
            return
        for g in [group] if group else groups():
            typer.secho(f"{g}:", bold=True)
            for name, desc in [*describe_group(g), *_outside_options(g)]:
                typer.echo(f"  {name:<28} {desc}")


def _outside_options(group: str) -> list[tuple[str, str]]:
    """The installed plugins' names for a group with a ``custom`` option (names only; nothing is imported)."""
    from cprobe.registry import dist_of, entry_points_of

    spelled = {"intervention": ("cprobe.interventions", "intervention=custom intervention.name={}"),
               "dataset": ("cprobe.datasets", "dataset=custom dataset.type={}")}
    if group not in spelled:
        return []
    ep_group, how = spelled[group]
    out = []
    for name, eps in sorted(entry_points_of(ep_group).items()):
        pkg, ver = dist_of(eps[0])
        out.append((name, f"plugin ({pkg} {ver}): {how.format(name)}"))
    return out


@app.command(help="Aggregate any mix of runs and sweeps below a directory: each study's table and paper tables "
             "(rebuilt from the jobs' records), one leaderboard with bootstrap intervals, the studies' yardsticks side "
             "by side (yardsticks.md), records.parquet and report.html.")
def collect(
    directory: Annotated[Path, typer.Argument(help="Run or sweep output directory (e.g. outputs/sweeps/NAME/latest), "
                                              "or any directory of them.")],
    partial: Annotated[bool, typer.Option("--partial", help="Aggregate the finished jobs even if others failed or "
                                          "have not finished (they are listed as warnings).")] = False,
) -> None:
    with user_errors():
        from cprobe.pipeline import collect as do_collect

        out = do_collect(directory, partial=partial)
        for study, path in out.results.items():
            typer.echo(f"wrote {path}" + (f" ({study})" if len(out.results) > 1 else ""))
        typer.echo(f"wrote {out.leaderboard}")
        typer.echo(f"wrote {out.yardsticks}")
        typer.echo(f"wrote {out.report} ({out.jobs} job(s): {', '.join(out.studies)})")


@app.command(help="Show every point of a sweep (or run) directory: done, running, queued, failed, interrupted, dead "
             "or not run, from the points' status.json, their SLURM tasks' records and the scheduler (squeue; sacct "
             "where the cluster keeps accounting). Exits 1 when a point needs a re-run (failed, dead, interrupted, "
             "not run).")
def status(
    directory: Annotated[Path, typer.Argument(help="A sweep dir (e.g. outputs/sweeps/NAME/latest) or a run dir.")],
    done: Annotated[bool, typer.Option("--all", help="List the finished points too (by default only their count "
                                       "when there are more than 20).")] = False,
) -> None:
    with user_errors():
        import logging

        from cprobe.sweep import NEEDS_ACTION, sweep_state

        logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)

        if not directory.is_dir():
            raise CprobeError(f"{directory} is not a directory; pass a sweep or run output dir "
                              "(e.g. outputs/sweeps/NAME/latest)")
        st = sweep_state(directory)
        if not st.points:
            raise CprobeError(f"no job under {directory} (no status.json, no SLURM manifest): did it start?")
        jobs = f" (SLURM job {', '.join(st.jobs)})" if st.jobs else ""
        typer.echo(f"{directory}: {st.summary()}{jobs}")
        if st.note:
            typer.echo(f"note: {st.note}; the states are the points' own status.json", err=True)
        finished = [p for p in st.points if p.state == "done"]
        hide = not done and len(finished) > 20
        for p in st.points:
            if not (hide and p.state == "done"):
                typer.echo("  " + p.line())
        if hide:
            typer.echo(f"  ... and {len(finished)} done (--all lists them)")
        bad = [p for p in st.points if p.state in NEEDS_ACTION]
        if bad:
            typer.echo(f"{len(bad)} point(s) need a re-run (the same command, with hydra.sweep.dir={directory}, "
                       "runs only what is not done)", err=True)
            raise typer.Exit(1)


@app.command(help="(Re)build the self-contained report.html of a run or a collected directory from its files.")
def report(
    directory: Annotated[Path, typer.Argument(help="A run dir, or a sweep/collected dir (run `cprobe collect` first "
                                              "for its leaderboard and tables).")],
) -> None:
    with user_errors():
        from cprobe.report import build_report

        typer.echo(f"wrote {build_report(directory)}")


def _list_metrics() -> None:
    from cprobe.metrics.registry import METRICS

    by_study: dict[str, list] = {}
    for m in METRICS.values():
        by_study.setdefault(m.studies[0], []).append(m)
    for study, ms in by_study.items():
        typer.secho(f"{study}:", bold=True)
        for m in ms:
            unit = f", {m.unit}" if m.unit else ""
            head = ("  [leaderboard; ranks the study's settings in yardsticks]" if m.decides
                    else "  [leaderboard]" if m.headline else "")
            better = {"higher": "higher is better", "lower": "lower is better"}.get(m.direction, "no better direction")
            typer.echo(f"  {m.name:<26} {better}, range {m.range_text}{unit}{head}")
            typer.echo(f"      {m.definition}")
            typer.echo(f"      ref: {m.reference}; studies: {', '.join(m.studies)}")


@app.command(
    help="Run the conformance checks on methods: registered names (built-in or plugin) or package.module:Class, and "
         "key=value constructor settings (YAML values; with one method); --package checks every entry point of an "
         "installed package. A table of passed / failed / expected failure / skipped checks, each with a one-line "
         "reason; exit 1 when a check fails.")
def check(
    targets: Annotated[list[str] | None, typer.Argument(help="NAME or package.module:Class (e.g. leace, "
                                                        "my_lab.eraser:Eraser), then key=value settings.")] = None,
    package: Annotated[str | None, typer.Option("--package", help="Check every method an installed package "
                                                "declares as a cprobe entry point.")] = None,
    family: Annotated[str | None, typer.Option("--family", help="Check only this family (intervention, direction "
                                               "method, probe, explainer, metric, dataset type).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    xfail: Annotated[list[str] | None, typer.Option("--xfail", help="CHECK=REASON: a failure you expect (shown as "
                                                    "xfail, does not fail the run); repeatable.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="An expected failure that passes fails the run.")] = False,
    plugins: Annotated[list[str] | None, typer.Option("--plugins", help="A module to import first (it registers "
                                                      "names, as the config's plugins: list); repeatable.")] = None,
) -> None:
    import json

    with user_errors():
        from cprobe.registry import load_plugin_modules
        from cprobe.testing import format_table, package_targets, run_checks

        names = [t for t in targets or [] if "=" not in t or ":" in t.split("=", 1)[0]]
        params = _key_values([t for t in targets or [] if t not in names])
        if params and len(names) != 1:
            raise CprobeError("key=value settings go with exactly one method (check the others separately)")
        expected = {}
        for item in xfail or []:
            name, sep, reason = item.partition("=")
            if not sep or not name:
                raise CprobeError(f"--xfail {item!r}: write CHECK=REASON (e.g. check_deterministic='GPU kernels')")
            expected[name.strip()] = reason.strip()
        load_plugin_modules(list(plugins or []), "--plugins")
        todo: list = [(n, params) for n in names] + (package_targets(package) if package else [])
        if not todo:
            raise CprobeError("name a method to check (cprobe check leace), or --package DIST")
        results = []
        for target, kw in todo:
            results += run_checks(target, kw, family=family if isinstance(target, str) else None,
                                  expected_failures=expected, strict=strict)
        typer.echo(json.dumps([r.as_dict() for r in results], indent=1) if as_json else format_table(results))
        if any(r.status == "failed" for r in results):
            raise typer.Exit(1)


def _key_values(args: list[str]) -> dict:
    """``key=value`` arguments, each value read as YAML (``rank=2`` an int, ``lrs=[0.01]`` a list)."""
    import yaml

    out = {}
    for a in args:
        key, sep, value = a.partition("=")
        if not sep or not key.isidentifier():
            raise CprobeError(f"{a!r}: constructor settings are key=value (e.g. rank=2)")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key] = value
    return out


@app.command(help="List the installed plugins (entry points of every family) with their package, version and "
             "whether they import; MODULE arguments (a config's plugins: list) are imported and their names listed.")
def plugins(
    modules: Annotated[list[str] | None, typer.Argument(help="Modules to import (as the config's plugins: list).")]
    = None,
) -> None:
    with user_errors():
        from cprobe.registry import PLUGIN_API_VERSION, plugins_enabled

        rows = _plugin_rows(list(modules or []))
        typer.echo(f"cprobe {__version__}, plugin API {PLUGIN_API_VERSION}"
                   + ("" if plugins_enabled() else " (entry points ignored: --no-plugins / CPROBE_NO_PLUGINS)"))
        if not rows:
            typer.echo("no plugins installed (a package declares entry points in the groups cprobe.interventions, "
                       "cprobe.directions, cprobe.probes, cprobe.explainers, cprobe.metrics, cprobe.datasets; "
                       "docs/extending.md)")
            return
        head = ("family", "name", "source", "target", "status")
        widths = [max(len(h), *(len(str(r[i])) for r in rows)) for i, h in enumerate(head[:4])]
        typer.echo("  ".join(h.ljust(w) for h, w in zip(head[:4], widths)) + "  status")
        for r in rows:
            typer.echo("  ".join(str(v).ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])
        if any(not r[4].startswith("ok") for r in rows):
            raise typer.Exit(1)


def _plugin_rows(modules: list[str]) -> list[tuple[str, str, str, str, str]]:
    """(family, name, package version, target, status) of every entry point and of every name the modules register;
    status ``ok`` (imports and is of its family), or the one-line reason it cannot be used."""
    from cprobe.registry import REGISTRIES, dist_of, entry_points_of, load_plugin_modules
    from cprobe.testing import registry_of

    registry_of("intervention")  # imports every family, so each has registered its registry
    rows = []
    for group, reg in list(REGISTRIES.items()):
        for name, eps in sorted(entry_points_of(group).items()):
            pkgs = [" ".join(dist_of(ep)) for ep in eps]
            if name in reg.builtin_names():
                status = "ignored: shadows a built-in name (a plugin never shadows a built-in)"
            elif len(eps) > 1:
                status = f"error: claimed by several packages ({' and '.join(pkgs)})"
            else:
                try:
                    reg.resolve(name)
                    status = "ok"
                except CprobeError as e:
                    status = "error: " + _one_line(str(e))
            rows.append((reg.kind, name, ", ".join(pkgs), eps[0].value, status))
    for module in modules:
        try:
            (loaded,) = load_plugin_modules([module], "plugins")
        except CprobeError as e:
            rows.append(("module", module, "", module, "error: " + _one_line(str(e))))
            continue
        src = f"{loaded.package} {loaded.version}".strip() or "(not packaged)"
        for kind, name in loaded.names:
            reg = next(r for r in REGISTRIES.values() if r.kind == kind)
            rows.append((kind, name, src, reg.provenance(name).target, "ok"))
        if not loaded.names:
            rows.append(("module", module, src, module, "ok (registers no name)"))
    return rows


@app.command(help="Where each dataset is expected and how to obtain it.")
def data() -> None:
    from cprobe.catalog import dataset_status

    with user_errors():
        for line in dataset_status():
            typer.echo(line)


@app.command(help="Print versions of cprobe and its core dependencies.")
def version() -> None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    typer.echo(f"cprobe {__version__}")
    for pkg in ("torch", "transformers", "hydra-core", "omegaconf", "scikit-learn", "pandas"):
        try:
            typer.echo(f"{pkg} {v(pkg)}")
        except PackageNotFoundError:
            typer.echo(f"{pkg} (not installed)")
    typer.echo(f"python {sys.version.split()[0]}")


@cache_app.command("info", help="List every cache entry (activations, models, finetuned, probe_fits, cloze, engine) "
                                "and its size.")
def cache_info() -> None:
    from cprobe.cache import CACHE_KINDS, cache_entries, unregistered
    from cprobe.paths import cache_dir

    with user_errors():
        root = cache_dir()
        typer.echo(f"cache dir: {root}")
        sizes = {k: 0 for k in CACHE_KINDS}
        for kind, name, size, desc in cache_entries(root):
            sizes[kind] += size
            typer.echo(f"  {kind:<12} {name:<26} {size / 2**20:9.1f} MiB  {desc}")
        for kind, what in CACHE_KINDS.items():
            typer.echo(f"{kind}: {sizes[kind] / 2**20:.1f} MiB ({what})")
        typer.echo(f"total: {sum(sizes.values()) / 2**20:.1f} MiB")
        for stray in unregistered(root):
            typer.echo(f"warning: {root / stray} is not a cprobe cache kind (not listed, never cleared)", err=True)


@cache_app.command("clear", help="Delete cache entries: all, or one kind (activations, models, finetuned, probe_fits, "
                                 "cloze, engine). Only entries cprobe wrote (recognised by its checksums "
                                 "and manifests) are deleted; any other file is kept and counted.")
def cache_clear(
    what: Annotated[str, typer.Argument(help="all | activations | models | finetuned | probe_fits | cloze | engine")] = "all",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    from cprobe.cache import CACHE_KINDS, clear_cache
    from cprobe.paths import cache_dir

    with user_errors():
        kinds = ["all", *CACHE_KINDS]
        if what not in kinds:
            raise CprobeError(f"unknown cache kind {what!r}; choose from {kinds}")
        if not yes and not typer.confirm(f"delete {what} under {cache_dir()}?"):
            raise typer.Exit(1)
        n, kept = clear_cache(cache_dir(), what)
        typer.echo(f"removed {n} entries")
        if kept:
            shown = ", ".join(str(p.relative_to(cache_dir())) for p in kept[:3]) + (" …" if len(kept) > 3 else "")
            typer.echo(f"kept {len(kept)} file(s) cprobe did not write: {shown}")


@mib_app.command("verify", help="Check an MIB submission folder as MIB's verify_submission.py does (re-implemented: "
                                "checkpoints read with torch.load(weights_only=True), Python files parsed, never run). "
                                "Exits 1 on an error or when no valid (task, model, variable) triplet is found.")
def mib_verify(
    directory: Annotated[Path, typer.Argument(help="The submission folder (e.g. RUN/mib_submission/das).")],
    model: Annotated[list[str] | None, typer.Option("--model", help="An architecture class to accept beside MIB's "
                                                    "four (e.g. GPTNeoXForCausalLM); repeatable.")] = None,
) -> None:
    with user_errors():
        from cprobe.mib_format import verify

        if not directory.is_dir():
            raise CprobeError(f"{directory} is not a directory; pass an MIB submission folder")
        verdict = verify(directory, tuple(model or ()))
        typer.echo(verdict.text())
        if not verdict.ok:
            raise typer.Exit(1)


def main() -> None:
    from cprobe.compute import set_wait_policy

    set_wait_policy(sys.argv[1:])  # first, before anything loads torch: OpenMP reads its wait policy once, then
    app()
