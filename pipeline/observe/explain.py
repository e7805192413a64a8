"""Why a step's identity is what it is, and how it differs from other runs of the same step.

A step's identity is the hash of its identity payload (`pipeline.core.identity`): name, version,
versioned fields by dotted path, and upstream identities by input path. Every step directory
records that payload in its `.step.json`. `explain_step` lists the payload of a step and diffs
it against every other `<name>-<hash>` directory of the same name under the prefix: which
versioned fields changed (old → new), whether the version string changed, and which upstream
identities changed, following each changed upstream down to the field that moved.

`plan_explanations` gives the one-line form for the steps of a plan that will run under a new
identity ("new identity: lr 0.003→0.001 (vs train/x-0a1b2c3d4e5f SUCCESS)"). It reads storage
only for those steps and lists each parent directory once, so a cached plan costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.dag import Dag
from pipeline.core.drift import MISSING, json_diff, short
from pipeline.core.identity import HASH_CHARS
from pipeline.core.plan import Plan, State
from pipeline.core.records import Event, StepRecord
from pipeline.storage.files import Storage
from pipeline.storage.layout import split_label
from pipeline.storage.step_store import StepStore
from pipeline.sweeps import is_point_name

__all__ = [
    "Change",
    "Explanation",
    "OtherRun",
    "diff_payloads",
    "explain_step",
    "format_explanation",
    "one_line",
    "plan_explanations",
]

MAX_DEPTH = 32
"""How far `explain` follows changed upstream identities."""
MAX_CANDIDATES = 64
"""Most other runs of one step that the plan's one-line form reads (a bound on planning time)."""

_MISSING = MISSING


@dataclass(frozen=True)
class Change:
    """One difference between two identity payloads."""

    kind: str
    """`version`, `versioned` (a field), or `input` (an upstream identity or sub-path)."""
    path: str
    """Dotted config path (`optimizer.lr`, `data.train`); empty for `version`."""
    old: Any
    new: Any
    upstream: str = ""
    """For `input`: the upstream step's name (or label)."""
    because: tuple[Change, ...] = ()
    """For `input`: what changed in that upstream, when its earlier run is under the prefix."""

    def describe(self) -> str:
        """`optimizer.lr 0.003→0.001`, `version 'v1'→'v2'`, `input data.train: tokenized/x changed`."""
        if self.kind == "version":
            return f"version {_short(self.old)}→{_short(self.new)}"
        if self.kind == "versioned":
            return f"{self.path} {_short(self.old)}→{_short(self.new)}"
        if self.old is _MISSING or self.new is _MISSING:
            what = "added" if self.old is _MISSING else "removed"
            return f"input {self.path} {what}"
        if self.old[0] == self.new[0]:
            return f"input {self.path} sub-path {_short(self.old[1])}→{_short(self.new[1])}"
        text = f"upstream {self.upstream or self.path} changed"
        causes = self.root_causes()
        if causes:
            shown = [
                f"{name} {c.describe()}" if name != self.upstream else c.describe() for name, c in causes[:3]
            ]
            text += ": " + "; ".join(shown) + (f"; +{len(causes) - 3} more" if len(causes) > 3 else "")
        return text

    def root_causes(self) -> list[tuple[str, Change]]:
        """For a changed upstream: the changes furthest up that explain it, with the step they are in."""
        out: list[tuple[str, Change]] = []
        for c in self.because:
            if c.kind == "input" and c.because:
                out.extend(c.root_causes())
            else:
                out.append((self.upstream, c))
        unique: dict[tuple[str, str], tuple[str, Change]] = {}
        for name, c in out:  # values may be lists (unhashable): deduplicate by what is shown
            unique.setdefault((name, c.describe()), (name, c))
        return list(unique.values())


@dataclass(frozen=True)
class OtherRun:
    """Another run of the same step name under the prefix."""

    label: str
    output_path: str
    state: str | None
    """Its last state event (None: never started, or no `.status`)."""
    time: float | None
    changes: tuple[Change, ...] | None
    """From that run to the current declaration; None when its `.step.json` is missing."""


@dataclass(frozen=True)
class Explanation:
    """What `drydock explain` prints about one step."""

    label: str
    hash: str
    output_path: str
    payload: Mapping[str, Any]
    inputs: Mapping[str, str]
    """Input path -> upstream label."""
    state: str | None
    """The last state event of this very identity's directory, if it has one."""
    others: tuple[OtherRun, ...] = field(default=())
    step_json_note: str | None = None
    """Set when this identity's `.step.json` is not the one its SUCCESS recorded (edited since)."""
    adopted: str | None = None
    """Set when the output was adopted (`drydock adopt`): from where, by whom, when."""


def _short(value: Any, width: int = 48) -> str:
    return short(value, width)


def diff_payloads(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    upstream_names: Mapping[str, str] | None = None,
    explain_upstream: Callable[[str, str, str], tuple[Change, ...] | None] | None = None,
) -> list[Change]:
    """The changes from identity payload `old` to `new`.

    `upstream_names` maps an input path to the upstream's name, for messages.
    `explain_upstream(path, old_hash, new_hash)` may say what changed in the upstream behind a
    changed input (None when its earlier run cannot be found).
    """
    changes: list[Change] = []
    if old.get("version") != new.get("version"):
        changes.append(Change("version", "", old.get("version"), new.get("version")))
    old_v, new_v = old.get("versioned", {}), new.get("versioned", {})
    for path in sorted(set(old_v) | set(new_v)):
        changes.extend(_value_changes(path, old_v.get(path, _MISSING), new_v.get(path, _MISSING)))
    old_in, new_in = old.get("inputs", {}), new.get("inputs", {})
    for path in sorted(set(old_in) | set(new_in)):
        a, b = old_in.get(path, _MISSING), new_in.get(path, _MISSING)
        if a == b:
            continue
        name = (upstream_names or {}).get(path, "")
        because: tuple[Change, ...] = ()
        if a is not _MISSING and b is not _MISSING and a[0] != b[0] and explain_upstream is not None:
            because = explain_upstream(path, a[0], b[0]) or ()
        changes.append(Change("input", path, a, b, name, because))
    return changes


def _value_changes(path: str, old: Any, new: Any) -> list[Change]:
    """A versioned value that is a whole dataclass, dict or list is diffed field by field
    (`optimizer.learning_rate 0.003→0.001`, not two dicts)."""
    return [Change("versioned", p, a, b) for p, a, b in json_diff(old, new, path)]


def _leaves(path: str, value: Any) -> list[tuple[str, Any]]:
    """A versioned value as dotted paths to its scalars (a dataclass's `__class__` left out)."""
    if isinstance(value, dict) and value:
        out = []
        for key in sorted(value, key=str):
            if key != "__class__":
                out.extend(_leaves(f"{path}.{key}", value[key]))
        return out
    return [(path, value)]


def _label_of(name: str, full_hash: str) -> str:
    return f"{name}-{full_hash[:HASH_CHARS]}"


def _parent(prefix: str, name: str) -> str:
    head = name.rsplit("/", 1)[0] if "/" in name else ""
    return f"{prefix.rstrip('/')}/{head}" if head else prefix.rstrip("/")


class _Reader:
    """Reads `.step.json` and `.status` of step directories, each at most once."""

    def __init__(self, store: StepStore) -> None:
        self.store = store
        self._json: dict[str, Mapping[str, Any] | None] = {}
        self._listing: dict[str, dict[str, list[str]]] = {}
        self._records: dict[str, StepRecord | None] = {}
        self.diffs: dict[tuple[str, str], tuple[Change, ...] | None] = {}
        """(earlier upstream dir, current upstream label) -> its changes: computed once."""

    def step_json(self, step_dir: str) -> Mapping[str, Any] | None:
        if step_dir not in self._json:
            info = self.store.read_step_json(step_dir)
            self._json[step_dir] = None if info is None or info.get("__corrupt__") else info
        return self._json[step_dir]

    def _index(self, directory: str) -> dict[str, list[str]]:
        """`<base>-<hash>` entries of `directory` by base name: one listing per directory."""
        if directory not in self._listing:
            index: dict[str, list[str]] = {}
            for entry in sorted(self.store.storage.listdir(directory)):
                parts = split_label(entry)
                if parts is not None:
                    index.setdefault(parts[0], []).append(entry)
            self._listing[directory] = index
        return self._listing[directory]

    def record(self, step_dir: str) -> StepRecord | None:
        """The step directory's record (None if it cannot be read), read once."""
        if step_dir not in self._records:
            try:
                self._records[step_dir] = self.store.record(step_dir, with_metadata=False)
            except Exception:
                self._records[step_dir] = None
        return self._records[step_dir]

    def state(self, step_dir: str) -> tuple[str | None, float | None]:
        record = self.record(step_dir)
        if record is None:
            return None, None
        if record.corrupt:
            return "CORRUPT", None
        last = record.last
        return (last.event, last.time) if last else (None, None)

    def siblings(self, prefix: str, name: str) -> list[tuple[str, str]]:
        """(name, output path) of every `<name>-<hash>` directory under `prefix`; for a sweep's
        run (`train/lr=0.003`), of every run of its template (`train/lr=0.01-<hash>`, ...)."""
        parent = _parent(prefix, name)
        head, _, last = name.rpartition("/")
        index = self._index(parent)
        bases = [b for b in index if is_point_name(f"{head}/{b}")] if is_point_name(name) else [last]
        return [
            (f"{head}/{base}" if head else base, f"{parent}/{entry}")
            for base in sorted(bases)
            for entry in index.get(base, [])
        ]


def _upstream_explainer(
    dag: Dag, label: str, reader: _Reader, old_info: Mapping[str, Any], depth: int
) -> Callable[[str, str, str], tuple[Change, ...] | None]:
    """`explain_upstream` for `diff_payloads`: finds the earlier upstream through the old run's
    recorded deps and diffs it against the current upstream, once per pair (DAGs share upstreams)."""
    node = dag.nodes[label]
    old_deps = [*old_info.get("deps", []), *old_info.get("soft_deps", [])]

    def explain(path: str, old_hash: str, new_hash: str) -> tuple[Change, ...] | None:
        up_label = node.inputs.get(path)
        if up_label is None or depth >= MAX_DEPTH:
            return None
        suffix = f"-{old_hash[:HASH_CHARS]}"
        old_dir = next((d for d in old_deps if d.rstrip("/").endswith(suffix)), None)
        if old_dir is None:  # older metadata without deps: the same name is the best guess
            old_dir = dag.output_path(up_label).rsplit("-", 1)[0] + suffix
        key = (old_dir, up_label)
        if key not in reader.diffs:
            reader.diffs[key] = _changes_from(dag, up_label, reader, old_dir, depth + 1)
        return reader.diffs[key]

    return explain


def _changes_from(
    dag: Dag, label: str, reader: _Reader, old_dir: str, depth: int = 0
) -> tuple[Change, ...] | None:
    """What changed from the run in `old_dir` to the current `label`; None without its `.step.json`."""
    info = reader.step_json(old_dir)
    if info is None or "identity" not in info:
        return None
    node = dag.nodes[label]
    names = {p: dag.nodes[u].name for p, u in node.inputs.items()}
    explainer = _upstream_explainer(dag, label, reader, info, depth)
    return tuple(
        diff_payloads(
            info["identity"], node.identity.payload, upstream_names=names, explain_upstream=explainer
        )
    )


def explain_step(dag: Dag, label: str, store: StepStore) -> Explanation:
    """The identity payload of `label` and its differences from every other run of its name."""
    node = dag.nodes[label]
    reader = _Reader(store)
    state, _ = reader.state(node.output_path)
    others = []
    for other_name, other_dir in reader.siblings(dag.prefix, node.name):
        if other_dir.rstrip("/") == node.output_path.rstrip("/"):
            continue
        other_state, when = reader.state(other_dir)
        others.append(
            OtherRun(
                label=_label_of(other_name, other_dir.rsplit("-", 1)[-1]),
                output_path=other_dir,
                state=other_state,
                time=when,
                changes=_changes_from(dag, label, reader, other_dir),
            )
        )
    # Newest first: the run someone just did is the one they compare with.
    others.sort(key=lambda o: -(o.time or 0.0))
    return Explanation(
        label=label,
        hash=node.identity.hash,
        output_path=node.output_path,
        payload=node.identity.payload,
        inputs=dict(node.inputs),
        state=state,
        others=tuple(others),
        step_json_note=_step_json_note(reader, node.output_path),
        adopted=_adopted(reader, node.output_path),
    )


def _committed(reader: _Reader, step_dir: str) -> Mapping[str, Any]:
    """The data of the SUCCESS the step directory ends in ({} if it is not committed)."""
    record = reader.record(step_dir)
    last = record.last if record is not None else None
    return last.data if last is not None and last.event == Event.SUCCESS else {}


def _adopted(reader: _Reader, step_dir: str) -> str | None:
    """ "<from> by <who> at <when>" if the committed output was adopted, not made by a run."""
    adopted = _committed(reader, step_dir).get("adopted")
    if not isinstance(adopted, dict):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(adopted.get("at") or 0))
    return f"not made by a run: {adopted.get('from')} adopted by {adopted.get('by')} at {when}"


def _step_json_note(reader: _Reader, step_dir: str) -> str | None:
    """What is wrong with a committed step's `.step.json`, if it is not the file its SUCCESS
    recorded the digest of. Plans do not read it (SUCCESS is the record of what ran)."""
    recorded = _committed(reader, step_dir).get("step_json")
    if not isinstance(recorded, str):
        return None  # not committed, or committed by a version that recorded no digest
    current = reader.store.step_json_digest(step_dir)
    if current == recorded:
        return None
    what = "is missing" if current is None else "was changed after the step committed"
    return f"its .step.json {what}; its SUCCESS record (what ran) is unchanged"


def _change_lines(changes: Sequence[Change], indent: str) -> list[str]:
    lines = []
    for c in changes:
        if c.kind == "input" and c.because:
            lines.append(
                f"{indent}input {c.path}: upstream {c.upstream} changed "
                f"({c.old[0][:HASH_CHARS]} → {c.new[0][:HASH_CHARS]}), because:"
            )
            lines.extend(_change_lines(c.because, indent + "    "))
        elif c.kind == "input" and c.old is not _MISSING and c.new is not _MISSING and c.old[0] != c.new[0]:
            lines.append(
                f"{indent}input {c.path}: upstream {c.upstream} changed "
                f"({c.old[0][:HASH_CHARS]} → {c.new[0][:HASH_CHARS]}; its earlier run is not "
                "under the prefix)"
            )
        else:
            lines.append(f"{indent}{c.describe()}")
    return lines


def format_explanation(exp: Explanation, dag: Dag, *, now: float) -> str:
    """The text `drydock explain` prints."""
    p = exp.payload
    lines = [
        f"{exp.label}",
        f"  output:   {exp.output_path}  [{exp.state or 'not started'}]",
        *([f"  note:     {exp.step_json_note}"] if exp.step_json_note else []),
        *([f"  adopted:  {exp.adopted}"] if exp.adopted else []),
        f"  identity: sha256 {exp.hash}",
        "  of (everything below, nothing else):",
        f"    name     {p.get('name')!r}",
        f"    version  {p.get('version')!r}",
    ]
    versioned = p.get("versioned", {})
    leaves = [(leaf, v) for path, value in sorted(versioned.items()) for leaf, v in _leaves(path, value)]
    # The count is of the lines that follow: a versioned dataclass is listed field by field.
    lines.append(f"    versioned fields ({len(leaves)}):" if leaves else "    versioned fields: none")
    lines.extend(f"      {leaf} = {_short(v, 80)}" for leaf, v in leaves)
    inputs = p.get("inputs", {})
    lines.append(f"    inputs ({len(inputs)}):" if inputs else "    inputs: none")
    for path, (up_hash, sub) in sorted(inputs.items()):
        up = exp.inputs.get(path, up_hash[:HASH_CHARS])
        lines.append(f"      {path} <- {up}" + (f" / {sub}" if sub else ""))
    lines.append("  Unversioned fields, resources and the function's code are recorded in .step.json but")
    lines.append("  do not enter identity (the plan notes when they drift).")
    if not exp.others:
        lines.append(f"No other run of {p.get('name')!r} under {dag.prefix}.")
    for other in exp.others:
        when = f", {_ago(now - other.time)} ago" if other.time else ""
        lines.append(f"vs {other.label} ({other.state or 'never started'}{when}):")
        if other.changes is None:
            lines.append("    cannot compare: its .step.json is missing or unreadable")
        elif not other.changes:
            lines.append("    same identity payload (a hash from another Drydock version?)")
        else:
            lines.extend(_change_lines(other.changes, "    "))
    return "\n".join(lines) + "\n"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def one_line(changes: Sequence[Change], other: OtherRun, limit: int = 3) -> str:
    """`new identity: lr 0.003→0.001 (vs train/x-0a1b2c3d4e5f SUCCESS)`."""
    shown = "; ".join(c.describe() for c in changes[:limit])
    if len(changes) > limit:
        shown += f"; +{len(changes) - limit} more"
    return f"new identity: {shown} (vs {other.label} {other.state or 'never started'})"


def plan_explanations(plan: Plan, storage: Storage) -> dict[str, str]:
    """One line per step that will run under an identity with no directory yet, saying what
    differs from the closest other run of the same name (fewest changes; SUCCESS first, then newest)."""
    dag = plan.dag
    reader = _Reader(StepStore(storage))
    out: dict[str, str] = {}
    for label in plan.in_state(State.RUN):
        sp = plan.steps[label]
        if sp.record is not None and sp.record.events:
            continue  # a rerun of this very identity: its reason already says why
        node = dag.nodes[label]
        candidates = [(n, d) for n, d in reader.siblings(dag.prefix, node.name) if d != node.output_path]
        best: tuple[tuple[int, int, float], OtherRun] | None = None
        for other_name, other_dir in candidates[-MAX_CANDIDATES:]:
            changes = _changes_from(dag, label, reader, other_dir)
            if changes is None:
                continue
            state, when = reader.state(other_dir)
            other = OtherRun(
                _label_of(other_name, other_dir.rsplit("-", 1)[-1]), other_dir, state, when, changes
            )
            rank = (len(changes), 0 if state == "SUCCESS" else 1, -(when or 0.0))
            if best is None or rank < best[0]:
                best = (rank, other)
        if best is not None and best[1].changes:
            out[label] = one_line(best[1].changes, best[1])
    return out
