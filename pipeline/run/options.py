"""The options of a run: `ExecutorMainConfig`, parsed from the command line with draccus.

`executor_main` and `drydock run|plan|status|...` share them. Each backend's own options are a
nested config (`--ray.address HOST:PORT`); `--ray_address` keeps working.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.core.lease import CLOCK_SKEW
from pipeline.errors import StepDeclarationError
from pipeline.run.backends import REGISTRY

__all__ = [
    "DEFAULT_PREFIX",
    "SECRET_FLAGS",
    "ExecutorMainConfig",
    "LocalOptions",
    "RayOptions",
    "parse_options",
    "redact_argv",
    "resolve_prefix",
    "validate_options",
]

DEFAULT_PREFIX = "./drydock-runs"


SECRET_FLAGS = ("--notify",)
"""Command-line options whose value is a secret: recorded as `<redacted>`."""


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of every secret option replaced by `<redacted>`."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("<redacted>")
            hide = False
            continue
        flag, eq, _value = arg.partition("=")
        if flag in SECRET_FLAGS:
            out.append(f"{flag}=<redacted>" if eq else arg)
            hide = not eq
            continue
        out.append(arg)
    return out


@dataclass(frozen=True)
class RayOptions:
    """Options of the `ray` backend (`--ray.address`, `--ray.num_cpus`)."""

    address: str | None = None
    """Ray cluster to join (default: $RAY_ADDRESS, else start a local instance for the run)."""
    num_cpus: int | None = None
    """CPUs of a private local instance (default: all of this machine's)."""


@dataclass(frozen=True)
class LocalOptions:
    """Options of the `local` backend (none yet)."""


@dataclass(frozen=True)
class ExecutorMainConfig:
    """Options of `executor_main` and of `drydock run|plan|status`."""

    prefix: str | None = None
    """Storage prefix for step outputs (local path, memory://, gs://, s3://...).
    Default: $DRYDOCK_PREFIX, else ./drydock-runs."""
    backend: str = "ray"
    """Where step functions run: ray (a local Ray instance, or the cluster at --ray.address)
    or local (threads of this process)."""
    ray: RayOptions = field(default_factory=RayOptions)
    """Options of the ray backend."""
    local: LocalOptions = field(default_factory=LocalOptions)
    """Options of the local backend."""
    ray_address: str | None = None
    """Same as --ray.address (the older spelling)."""
    dry_run: bool = False
    """Print the plan and exit without running anything."""
    json: bool = False
    """Print the plan (or the run's outcome) as JSON on stdout; logs go to stderr."""
    compile: bool = False
    """Build and compile each selected step that can be (a training, for its declared hardware)
    without running it: the plan shows what the compiler says it needs; a run compiles the steps
    it is about to run first. A program that does not fit its devices is refused (exit 2)."""
    only: str | None = None
    """Regex on step names: run only matching steps and what they need."""
    force: str | None = None
    """Regex on step names: redo matching steps (from an emptied output) and everything downstream."""
    max_concurrent: int | None = None
    """Most steps running at once (default: the backend's choice)."""
    lease_timeout: float = 90.0
    """Seconds without a heartbeat after which another runner may take a step over."""
    heartbeat_interval: float = 30.0
    """Seconds between lease renewals."""
    wait_poll_interval: float = 2.0
    """Seconds between checks of steps that another runner is running."""
    clock_skew: float = CLOCK_SKEW
    """Seconds by which the clocks of runners sharing the prefix may differ. A step another
    runner holds is taken over once its lease has been seen unchanged for --lease_timeout (this
    runner's own clock), or once it expired more than this long ago by this runner's clock."""
    experiment: str | None = None
    """Experiment name for the manifest (default: the experiment file's name)."""
    log_level: str = "INFO"
    """Logging level of Drydock's own messages on stderr: DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    verbose: bool = False
    """Stream the steps' own output (Levanter, JAX, Ray, tqdm) to the console as well; without it,
    that goes only to each attempt's log, `<step>/.logs/attempt-<token>.log`."""
    budget_device_hours: float | None = None
    """The most device-hours the experiment's steps may hold, every attempt of every run together
    (the ledger, `drydock status --ledger`): a run whose estimate exceeds what is left is refused;
    once a run spends it, its trainings stop at a checkpoint (CANCELLED) and nothing else starts.
    Raise it and run again to go on."""
    budget_dollars: float | None = None
    """The same in US dollars, at the price table (`$DRYDOCK_PRICES`, `pipeline.core.prices`)."""
    notify: str | None = None
    """A webhook (http or https URL; Slack-compatible JSON) told when a step fails, hangs, rewinds
    or is preempted again and again, and when the run ends. Default: $DRYDOCK_NOTIFY. A secret:
    never recorded in manifests or logs."""

    def __post_init__(self) -> None:
        # One place holds the address: `--ray_address` (and `ray_address=`) fill `ray.address`.
        if self.ray_address and not self.ray.address:
            object.__setattr__(self, "ray", replace(self.ray, address=self.ray_address))


def resolve_prefix(prefix: str | None) -> str:
    """The prefix to use: the given one, else $DRYDOCK_PREFIX, else ./drydock-runs (normalized)."""
    from pipeline.storage.opening import normalize_prefix

    return normalize_prefix(prefix or os.environ.get("DRYDOCK_PREFIX") or DEFAULT_PREFIX)


def validate_options(config: ExecutorMainConfig) -> None:
    """Raise a `StepDeclarationError` naming the option, for any option that cannot work."""
    if config.backend not in REGISTRY:
        raise StepDeclarationError(
            None,
            f"unknown backend {config.backend!r}; choose one of {', '.join(REGISTRY)}",
            field="--backend",
        )
    if config.max_concurrent is not None and config.max_concurrent < 1:
        raise StepDeclarationError(None, "must be at least 1", field="--max_concurrent")
    if config.lease_timeout <= 0 or config.heartbeat_interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--lease_timeout/--heartbeat_interval")
    if config.clock_skew < 0:
        raise StepDeclarationError(None, "must be zero or more", field="--clock_skew")
    if config.wait_poll_interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--wait_poll_interval")
    for name in ("budget_device_hours", "budget_dollars"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise StepDeclarationError(None, f"must be a positive number, not {value!r}", field=f"--{name}")
    if logging.getLevelName(config.log_level.upper()) not in (10, 20, 30, 40, 50):
        raise StepDeclarationError(
            None,
            f"unknown log level {config.log_level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL",
            field="--log_level",
        )
    if config.heartbeat_interval >= config.lease_timeout:
        raise StepDeclarationError(
            None,
            f"heartbeat interval {config.heartbeat_interval}s must be shorter than the lease timeout "
            f"{config.lease_timeout}s, or leases expire between heartbeats",
            field="--heartbeat_interval",
        )
    url = notify_url(config)
    if url is not None:
        from pipeline.run.console.alerts import check_webhook

        problem = check_webhook(url)
        if problem is not None:
            where = "--notify" if config.notify else "$DRYDOCK_NOTIFY"
            # The URL is a secret: say what is wrong with it without repeating it.
            raise StepDeclarationError(None, f"the webhook {problem}", field=where)


def notify_url(config: ExecutorMainConfig) -> str | None:
    """The webhook of the run: `--notify`, else $DRYDOCK_NOTIFY, else none."""
    return config.notify or os.environ.get("DRYDOCK_NOTIFY") or None


_BOOL_FLAGS = ("--dry_run", "--json", "--verbose", "--compile")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Let boolean flags stand alone (`--dry_run`), as draccus wants `--dry_run true`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg in _BOOL_FLAGS and (nxt is None or nxt.startswith("--")):
            out.append("true")
    return out


def _help_formatter() -> type:
    """draccus's help formatter, without its "(default: None)" after a help text that already says
    what the default is (`--prefix`: "Default: $DRYDOCK_PREFIX, else ./drydock-runs")."""
    from draccus.help_formatter import SimpleHelpFormatter

    class HelpFormatter(SimpleHelpFormatter):
        def add_arguments(self, actions: Any) -> None:
            # draccus registers a nested config's "Config file for ray" option twice (once as the
            # parent's child, once as the section itself): list each option once.
            seen = getattr(self, "_drydock_seen", set())
            self._drydock_seen = seen
            unique = []
            for action in actions:
                key = tuple(action.option_strings)
                if key and key in seen:
                    continue
                seen.add(key)
                unique.append(action)
            super().add_arguments(unique)

        def _get_help_string(self, action: Any) -> str:
            text = action.help or ""
            if action.default is None or "default" in text.lower():
                return text
            return str(super()._get_help_string(action))

    return HelpFormatter


def parse_options(argv: Sequence[str]) -> ExecutorMainConfig:
    """Parse executor options; an unknown or malformed flag is a `StepDeclarationError`."""
    from draccus.argparsing import ArgumentParser

    try:
        parser = ArgumentParser(ExecutorMainConfig, formatter_class=_help_formatter(), exit_on_error=False)
        return parser.parse_args(normalize_argv(argv))
    except Exception as e:  # draccus raises its own exception types for parse errors
        # draccus spreads some messages over several lines; the CLI promises one.
        detail = " ".join(str(e).split())
        raise StepDeclarationError(None, f"bad command-line option: {detail}", field="argv") from e
