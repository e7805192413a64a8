"""The `drydock` command: one table of commands, each a function in a module of this package.

    drydock run FILE [options]        plan and run (same as `python FILE [options]`)
    drydock plan FILE [options]       print the plan, run nothing (= `--dry_run`)
    drydock status FILE [options]     what storage says about each step now
    drydock rerun MANIFEST [options]  rebuild a run's DAG from its manifest alone and run it
    drydock dag FILE [--format F]     the DAG as Mermaid, DOT, SVG or one HTML page
    drydock explain FILE STEP         why STEP's identity is what it is
    drydock data FILE STEP            what a curation step removed and why, with samples
    drydock compare RUN [RUN ...]     runs side by side: the fields that differ, the metrics
    drydock gc [--prefix P] ...       list (and delete) step outputs no kept manifest references
    drydock pin PATH|LABEL            protect a step output from `drydock gc`
    drydock adopt FILE STEP FROM      commit an existing directory as STEP's output
    drydock cluster start|stop|list   a Ray cluster on this machine, to try gangs of hosts
    drydock dashboard [--prefix P]    a read-only web page of the prefix

Wherever FILE is accepted, a run manifest (`<prefix>/experiments/<name>-<hash>.json`, a local
path or any fsspec URL) may stand in for it: the DAG is rebuilt from the recipe it records.
Adding a command is one `Command` entry below and one function `(args) -> exit code`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["COMMANDS", "Command", "main"]


@dataclass(frozen=True)
class Command:
    """One `drydock` command: where its function is, and its lines of the usage text."""

    name: str
    module: str
    function: str
    usage: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "pipeline.cli.run",
        "run_command",
        "drydock run FILE|MANIFEST [options]",
        "plan the experiment in FILE and run every step that is not done",
    ),
    Command(
        "plan",
        "pipeline.cli.run",
        "plan_command",
        "drydock plan FILE|MANIFEST [options]",
        "print the plan (what would run, and why) without running anything",
    ),
    Command(
        "status",
        "pipeline.cli.views",
        "status_command",
        "drydock status FILE|MANIFEST [--watch] [--interval S] [--wait S] [--json] [options]",
        "show what storage says about each step of FILE now\n"
        "(--watch: refresh every --interval seconds while steps run; --json)",
    ),
    Command(
        "rerun",
        "pipeline.cli.run",
        "rerun_command",
        "drydock rerun MANIFEST [options]",
        "rebuild the DAG recorded in a run manifest (no experiment file needed) and run it;\n"
        "--prefix defaults to the manifest's own prefix, so a rerun there is fully cached",
    ),
    Command(
        "dag",
        "pipeline.cli.views",
        "dag_command",
        "drydock dag FILE|MANIFEST [--format mermaid|dot|svg|html] [--output PATH]",
        "draw the DAG with each step's state as a colour (default: Mermaid on stdout)",
    ),
    Command(
        "explain",
        "pipeline.cli.views",
        "explain_command",
        "drydock explain FILE|MANIFEST STEP [options]",
        "say what STEP's identity is made of, and what differs in its other runs under the prefix",
    ),
    Command(
        "data",
        "pipeline.cli.views",
        "data_command",
        "drydock data FILE|MANIFEST STEP [--samples N] [--reason R] [--json] [options]",
        "what a curation step removed and why, per reason with sampled documents (text escaped,\n"
        "long ones cut), beside documents it kept; --reason shows one reason's",
    ),
    Command(
        "compare",
        "pipeline.cli.compare",
        "compare_command",
        "drydock compare RUN [RUN ...] [--prefix P] [--sort METRIC [--desc]] [--all | --json | --csv]",
        "runs side by side (RUN: a manifest, an experiment file or a step directory): one row per\n"
        "training, the versioned fields that differ among them, then the metrics each recorded",
    ),
    Command(
        "gc",
        "pipeline.cli.gc",
        "gc_command",
        "drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]",
        "list step outputs that no kept manifest references (default: every manifest under the\n"
        "prefix), never running, leased or pinned ones; delete them after confirmation (--yes)",
    ),
    Command(
        "pin",
        "pipeline.cli.gc",
        "pin_command",
        "drydock pin PATH|LABEL [--prefix P] [--unpin]",
        "mark a step output (a path, or a label under --prefix) so that gc keeps it; --unpin",
    ),
    Command(
        "adopt",
        "pipeline.cli.adopt",
        "adopt_command",
        "drydock adopt FILE|MANIFEST STEP FROM [options]",
        "commit an existing directory FROM (made before Drydock, or by hand) as the output of STEP\n"
        "under its identity, so the steps downstream build on it; recorded as adopted and pinned",
    ),
    Command(
        "cluster",
        "pipeline.cli.cluster",
        "cluster_command",
        "drydock cluster start [--workers N] [--cpus C] [--gpus G] [--name NAME] | stop [NAME] | list",
        "a Ray cluster on this machine (a head and N worker nodes on loopback addresses, its token\n"
        "handled) to try gangs of hosts; `stop` stops exactly the nodes it started",
    ),
    Command(
        "dashboard",
        "pipeline.cli.dashboard",
        "main",
        "drydock dashboard [--prefix P] [--port N] [--host H]",
        "serve a read-only web page of the prefix: experiments, DAGs, steps, loss curves\n"
        "(default http://127.0.0.1:8008)",
    ),
)

_OPTIONS = """options (run, plan, status, dag, explain, rerun):
  --prefix P               storage prefix (default $DRYDOCK_PREFIX, else ./drydock-runs)
  --backend {backends:<14} where steps run (default ray: a private local instance, or --ray.address)
  --ray.address HOST:PORT  join a Ray cluster (default $RAY_ADDRESS; also --ray_address)
  --json                   machine-readable output on stdout
  --only REGEX             run only matching steps and what they need
  --force REGEX            rerun matching steps even if cached
  --max_concurrent N  --lease_timeout S  --heartbeat_interval S  --wait_poll_interval S
  --experiment NAME  --log_level LEVEL
run `drydock run FILE --help` for every option with its description."""


def usage() -> str:
    """The usage text, from the command table."""
    lines = ["usage: " + "\n       ".join(c.usage for c in COMMANDS), ""]
    for c in COMMANDS:
        first, *rest = c.help.split("\n")
        lines.append(f"  {c.name:<9} {first}")
        lines.extend(f"  {'':<9} {line}" for line in rest)
    return "\n".join([*lines, "", options_text()])


def options_text() -> str:
    """The common options' lines; the backends from their registry."""
    from pipeline.run.backends import REGISTRY  # the registry alone: no backend is imported

    return _OPTIONS.format(backends="|".join(REGISTRY))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drydock` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    by_name = {c.name: c for c in COMMANDS}
    command = by_name.get(args[0])
    if command is None:
        print(f"error: unknown command {args[0]!r}; choose one of {', '.join(by_name)}", file=sys.stderr)
        return 2
    if args[1:2] in (["-h"], ["--help"]) and command.name != "dashboard":  # dashboard: argparse's
        # `drydock rerun --help` before a file or manifest is named: what the command does and
        # its options (`drydock run FILE --help` lists every option with its default).
        takes_file = " FILE" in command.usage or " MANIFEST" in command.usage
        print(
            "\n".join(
                [f"usage: {command.usage}", "", command.help, *(["", options_text()] if takes_file else [])]
            )
        )
        return 0
    # Imported on use: `dashboard` loads the web stack, `run` the engine; `--help` loads neither.
    function = getattr(importlib.import_module(command.module), command.function)
    from pipeline.cli.common import quiet_broken_pipe

    return quiet_broken_pipe(lambda: int(function(args[1:])))
