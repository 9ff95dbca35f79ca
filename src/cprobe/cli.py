"""The ``cprobe`` command line (Typer). Heavy imports (torch, transformers, hydra) stay inside commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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

        hydra_msg = explain_error(e)
        if hydra_msg is not None:
            _fail(hydra_msg if "cprobe list" in hydra_msg or "--cfg job" in hydra_msg
                  else hydra_msg + " (see `cprobe list` and `cprobe run --cfg job`)")
        _fail(f"{type(e).__name__}: {_one_line(str(e))} (rerun with CPROBE_DEBUG=1 for the traceback)")


SMOKE_ENV = "CPROBE_SMOKE"


@contextmanager
def _detach_env(detach: bool) -> Iterator[None]:
    """``--detach``: CPROBE_DETACH=1 while the command runs (the SLURM launcher reads it; a run on any other launcher
    is refused by the sweep callback)."""
    if not detach:
        yield
        return
    before = os.environ.get("CPROBE_DETACH")
    os.environ["CPROBE_DETACH"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CPROBE_DETACH", None)
        else:
            os.environ["CPROBE_DETACH"] = before


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
    from cprobe.paths import config_dir

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
    with user_errors(), _detach_env(detach):
        from cprobe import callbacks, pipeline  # noqa: F401  (pipeline registers the config resolvers)

        os.environ["HYDRA_FULL_ERROR"] = "1"  # let errors reach user_errors() instead of Hydra's printer
        callbacks.reset()
        _hydra.run(argv, pipeline.run_job, str(config_dir()))
        if callbacks.FAILED:
            _fail(f"{len(callbacks.FAILED)} job(s) failed: " + "; ".join(callbacks.FAILED[:3])
                  + (f"; {callbacks.REPORT_FAILED[0]}" if callbacks.REPORT_FAILED else ""))
        if callbacks.REPORT_FAILED:
            _fail(callbacks.REPORT_FAILED[0])


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
            for name, desc in describe_group(g):
                typer.echo(f"  {name:<28} {desc}")


@app.command(help="Aggregate any mix of runs and sweeps below a directory: each study's table and paper tables "
             "(rebuilt from the jobs' records), one leaderboard with bootstrap intervals, records.parquet and "
             "report.html.")
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

        from cprobe.launch.sweep import NEEDS_ACTION, sweep_state

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
            head = "  [leaderboard]" if m.headline else ""
            better = {"higher": "higher is better", "lower": "lower is better"}.get(m.direction, "no better direction")
            typer.echo(f"  {m.name:<26} {better}, range {m.range_text}{unit}{head}")
            typer.echo(f"      {m.definition}")
            typer.echo(f"      ref: {m.reference}; studies: {', '.join(m.studies)}")


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


@cache_app.command("info", help="List every cache entry (activations, models, finetuned, probes, probe_fits, cloze, "
                                "engine) and its size.")
def cache_info() -> None:
    from cprobe.cache import CACHE_KINDS, cache_entries
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
        from cprobe.cache import unregistered

        for stray in unregistered(root):
            typer.echo(f"warning: {root / stray} is not a cprobe cache kind (not listed, never cleared)", err=True)


@cache_app.command("clear", help="Delete cache entries: all, or one kind (activations, models, finetuned, probes, "
                                 "probe_fits, cloze, engine).")
def cache_clear(
    what: Annotated[str, typer.Argument(help="all | activations | models | finetuned | probes | probe_fits | cloze | "
                                        "engine")] = "all",
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
        n = clear_cache(cache_dir(), what)
        typer.echo(f"removed {n} entries")


def main() -> None:
    app()
