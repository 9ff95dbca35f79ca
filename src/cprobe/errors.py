"""User-facing errors: one actionable line, no traceback (unless CPROBE_DEBUG=1)."""

from __future__ import annotations


class CprobeError(Exception):
    """An error caused by input the user controls (config, data, model name).

    The CLI prints ``str(err)`` on one line and exits with code 1; the message must
    name the problem and the fix.
    """


class ConfigError(CprobeError):
    """Impossible or inconsistent configuration value."""


class DataError(CprobeError):
    """Missing or malformed dataset file."""


class InputRefused(DataError):
    """Input refused once the model has read it (a RAVEL attribute whose values the model never writes): a single
    run leaves nothing behind, as for a config error."""


class ModelLoadError(CprobeError):
    """A model that is neither cached, local, nor reachable."""


class NotFittedError(CprobeError, AttributeError):
    """An estimator used before ``fit`` (an AttributeError too, so ``hasattr`` keeps working)."""

    def __init__(self, estimator: object, what: str = "fit") -> None:
        super().__init__(f"{type(estimator).__name__} is not fitted yet: call {what} first")


class JobAborted(BaseException):
    """A single run's user-facing error, carried past Hydra's own error logging to the CLI
    (a BaseException, so Hydra's ``except Exception`` does not log it with its overrides)."""

    def __init__(self, error: CprobeError) -> None:
        super().__init__(str(error))
        self.error = error


class Terminated(KeyboardInterrupt):
    """SIGTERM (or, in a SLURM array task, SIGUSR2: the time limit is near, or the task is preempted) received during a
    job: handled like Ctrl-C (the job is marked ``interrupted``), exit code 143. ``signame`` says which signal."""

    def __init__(self, *args: object, signame: str = "SIGTERM") -> None:
        super().__init__(*args)
        self.signame = signame


class DriverStopped(KeyboardInterrupt):
    """The process following a SLURM sweep was stopped (Ctrl-C or SIGTERM); its jobs go on. ``message`` says how to
    follow them; the CLI prints it and exits 130 (Ctrl-C) or 143 (SIGTERM)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and what it was raised from or during (``__cause__``, else ``__context__``), outermost first."""
    out: list[BaseException] = []
    while e is not None and e not in out and len(out) < 20:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def cprobe_cause(e: BaseException) -> CprobeError | None:
    """The CprobeError behind ``e`` (e.g. raised inside a plugin Hydra instantiates: Hydra re-raises it as
    "Error in call to target ..."), or None."""
    return next((c for c in _chain(e) if isinstance(c, CprobeError)), None)


def one_line(e: BaseException) -> str:
    """``e``'s message on one line; where it hides the OSError it was raised from (logging's "Unable to configure
    handler 'file'" names neither the file nor the error), that error — its path included — is appended."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    cause = next((c for c in _chain(e)[1:] if isinstance(c, OSError)), None)
    if cause is not None and str(cause) not in text:
        text += f": {type(cause).__name__}: {cause}"
    return text
