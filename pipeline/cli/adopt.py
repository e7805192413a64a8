"""`drydock adopt FILE|MANIFEST STEP FROM [options]`: commit an existing directory as STEP's output.

STEP is a step name or label of the experiment; FROM a directory (a path or URL) holding what
the step would have written. See `pipeline.run.scheduler.adopt`.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from pipeline.cli.common import find_step, guarded, needs_target
from pipeline.cli.loading import Loaded, load
from pipeline.core.dag import build_dag
from pipeline.errors import StepDeclarationError
from pipeline.processes import current_owner
from pipeline.run.options import resolve_prefix
from pipeline.run.scheduler.adopt import adopt
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["adopt_command"]


def adopt_command(args: Sequence[str]) -> int:
    """`drydock adopt FILE|MANIFEST STEP FROM [options]`."""
    return needs_target("adopt", args) or guarded(_adopt, args[0], args[1:])


def _adopt(target: str, argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        raise StepDeclarationError(
            None, "name the step and the directory: drydock adopt FILE STEP FROM", field="STEP"
        )
    wanted, source, options = argv[0], argv[1], list(argv[2:])

    def body(loaded: Loaded) -> int:
        dag = build_dag(loaded.steps, resolve_prefix(loaded.config.prefix))
        label = find_step(dag, wanted, target)
        store = StepStore(open_storage(dag.prefix))
        adopted = adopt(
            dag,
            store,
            label,
            source,
            current_owner(),
            lease_timeout=loaded.config.lease_timeout,
            heartbeat_interval=loaded.config.heartbeat_interval,
        )
        when = datetime.datetime.fromtimestamp(adopted["at"]).isoformat(timespec="seconds")
        print(
            f"adopted {source} ({adopted['files']} files) as {label} at {dag.nodes[label].output_path}\n"
            f"  by {adopted['by']} at {when}; pinned, so drydock gc keeps it"
        )
        if adopted.get("skipped"):
            print(f"  skipped {len(adopted['skipped'])}: {'; '.join(adopted['skipped'])}")
        return 0

    return load(target, options, body)
