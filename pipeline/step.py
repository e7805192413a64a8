"""Step declarations: `Step`, its placeholders and its `Resources`.

This module is what an experiment file touches, and it depends on nothing else in `pipeline`:
declaring a DAG must never pull in storage, planning or a backend. Everything here is an
immutable value; identity, validation and resolution live in `identity.py`, `graph.py` and
`configs.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "ADDED_FIELD",
    "APPLIES_WHEN",
    "HangPolicy",
    "OutputOf",
    "Resources",
    "Step",
    "StepHooks",
    "ThisOutput",
    "Versioned",
    "added_field",
    "applies_when",
    "hooks_of",
    "inapplicable_fields",
    "is_step_function",
    "output_of",
    "step_function",
    "this_output",
    "unversioned",
    "versioned",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A config value that is part of its step's identity (see `versioned`)."""

    value: T


ADDED_FIELD = "drydock_added_field"
"""Dataclass field metadata: the field was added after identities were made (see `added_field`)."""


def added_field(default: Any, *, doc: str = "") -> Any:
    """A field added to a config dataclass after steps were made with it: while it holds
    `default` it is left out of identity (and of the config as drift notes compare it), so every
    identity made before the field existed stays the same. A value other than the default enters
    identity as any field does. `default` must be immutable (a frozen value, a number, a string,
    a tuple, None).

        @dataclass(frozen=True)
        class ModelConfig:
            hidden_dim: int = 64
            sliding_window: int | None = added_field(None)   # new: old models keep their identity
    """
    return dataclasses.field(default=default, metadata={ADDED_FIELD: True, "doc": doc})


APPLIES_WHEN = "drydock_applies_when"
"""Dataclass field metadata: (sibling field, value) under which the field means anything."""


def applies_when(default: Any, *, field: str, equals: Any, doc: str = "") -> Any:
    """A config field that matters only when its sibling `field` equals `equals` (Muon's AdamW
    learning rate, in an optimizer spec that may name AdamW). It enters identity as any field does
    (nothing changes for steps made before it was marked); views leave it out where it does not
    apply: `.step.json` lists it under `inapplicable`, and the dashboard does not show it among
    the step's hyperparameters.

        @dataclass(frozen=True)
        class OptimizerSpec:
            name: str = "adamw"
            adam_learning_rate: float = applies_when(3e-3, field="name", equals="muon")
    """
    return dataclasses.field(default=default, metadata={APPLIES_WHEN: (field, equals), "doc": doc})


def inapplicable_fields(config: Any, path: str = "") -> list[str]:
    """Dotted paths of the fields of `config` (and the dataclasses inside it, `Versioned` or not)
    whose `applies_when` condition does not hold."""
    if isinstance(config, Versioned):
        return inapplicable_fields(config.value, path)
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return []
    out: list[str] = []
    for f in dataclasses.fields(config):
        here = f"{path}.{f.name}" if path else f.name
        condition = f.metadata.get(APPLIES_WHEN)
        if condition is not None:
            sibling = getattr(config, condition[0], None)
            sibling = unversioned(sibling)
            if sibling != condition[1]:
                out.append(here)
                continue
        out.extend(inapplicable_fields(getattr(config, f.name, None), here))
    return out


def versioned(value: T) -> T:
    """Mark `value` as part of the step's identity.

    Changing a versioned value gives the step a new identity (a new output directory), so it
    and everything downstream reruns. Unmarked config values are recorded but do not rerun.
    The declared type stays `T` so configs keep their annotations; the executor unwraps it
    before the step function sees the config.
    """
    return Versioned(value)  # type: ignore[return-value]


def unversioned(value: Any) -> Any:
    """The value inside a `versioned(...)` mark, or `value` itself: what a step factory reads
    from a config it was given (the executor unwraps configs before a step function sees them)."""
    return value.value if isinstance(value, Versioned) else value


@dataclass(frozen=True)
class OutputOf:
    """Placeholder for the output path of an upstream step (see `output_of`)."""

    step: Step | str
    """The upstream `Step`, or the name of a step declared elsewhere in the same DAG."""
    sub: str | None = None
    """A path inside the upstream output directory."""
    blocking: bool = True
    """Whether this step waits for the upstream step."""
    identity: bool = True
    """Whether the upstream identity enters this step's identity (see `output_of`)."""

    def __truediv__(self, sub: str) -> OutputOf:
        joined = f"{self.sub.rstrip('/')}/{sub}" if self.sub else sub
        return OutputOf(self.step, joined, self.blocking, self.identity)


def output_of(step: Step | str, sub: str | None = None, blocking: bool = True, identity: bool = True) -> Any:
    """The output path of `step` (or of `sub` inside it), resolved at run time.

    Adds a DAG edge and makes the upstream identity part of this step's identity.
    `blocking=False` keeps the identity but does not wait for the upstream step, e.g. to
    evaluate checkpoints of a training run that is still going.

    `identity=False` is for a path the step only consults, whose content cannot change what the
    step writes: a training's predicted loss, compared with its evaluations. The step still waits
    for the upstream step (unless `blocking=False`), but a new upstream identity does not rerun it.
    """
    return OutputOf(step, sub, blocking, identity)


@dataclass(frozen=True)
class ThisOutput:
    """Placeholder for the declaring step's own output directory (see `this_output`)."""

    sub: str | None = None


def this_output(sub: str | None = None) -> Any:
    """This step's own output directory (or `sub` inside it), resolved at run time."""
    return ThisOutput(sub)


@dataclass(frozen=True)
class Resources:
    """What a step needs to run. Resources never enter identity.

    `tpu="v5p-64"` asks for one TPU pod slice of that type; `slices=N` for multislice.
    `hosts=N` asks for N hosts at once, each with `cpus`, `memory`, `gpus` and `custom`: a gang
    that runs the step function in one process per host (`Resources(gpus=8, hosts=16,
    accelerator="H100")`: 16 hosts of 8 H100s).
    """

    cpus: float = 1
    """CPU cores (per host, for a gang)."""
    memory: str | None = None
    """Memory, e.g. "16GiB" (per host); None means no reservation."""
    gpus: float = 0
    """GPUs (whole or fractional; per host)."""
    tpu: str | None = None
    """A TPU pod slice type such as "v5p-64"."""
    slices: int = 1
    """Number of TPU slices (multislice) when `tpu` is set."""
    hosts: int = 1
    """Hosts reserved at once (all or nothing), one process each: more than one makes the step a
    gang (`pipeline.current_gang()`). For TPUs the slice type says it: leave this at 1."""
    accelerator: str | None = None
    """The GPU type, as Ray names it on its nodes ("H100", "H200", "B200", "GB200", "A100"):
    the step runs only on hosts of that type, and a training's memory and time estimates use
    its memory and peak FLOP/s. TPU types come from `tpu`."""
    custom: Mapping[str, float] = field(default_factory=dict)
    """Extra scheduler resources by name (Ray custom resources)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables for the step's process."""
    pip: tuple[str, ...] = ()
    """Extra pip requirements for the step's environment (Ray runtime_env)."""
    preemption_retries: int = 100
    """How often the step is retried after losing its machine (node died, slice preempted)."""
    failure_retries: int = 0
    """How often the step is retried after its function raised."""
    hang_timeout: float | None = None
    """Seconds without a progress report after which this step's attempt counts as hung (its
    step function must declare a watchdog); None: derived from the pace the step keeps."""
    crash_limit: int = 3
    """A crash of the step's process (a segfault, an out-of-memory kill) counts as a preemption,
    but the same crash this many times in a row counts as a failure: a deterministic crash must
    not burn the preemption budget. A lost host or node never counts towards it."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description, for plans and manifests."""
        # Field by field: dataclasses.asdict deep-copies, which planning 100,000 steps notices.
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["custom"] = dict(self.custom)
        out["env"] = dict(self.env)
        out["pip"] = list(self.pip)
        return out


@dataclass(frozen=True, eq=False)
class Step:
    """One node of an experiment's DAG: a function and the config it is called with.

    `fn(config)` runs with a copy of `config` in which every placeholder (`output_of`,
    `this_output`) is a path string and every `versioned` value is unwrapped. Two `Step`
    objects with the same identity are the same step; the executor de-duplicates them.
    Steps compare by object (eq=False): equality of steps is equality of identities,
    which `pipeline.core.identity` computes.
    """

    name: str
    """A slash path such as "tokenized/fineweb"; the output directory is `<prefix>/<name>-<hash>`."""
    fn: Callable[[Any], Any]
    """The step function; it must be importable (a module-level function)."""
    config: Any
    """A dataclass instance; may hold placeholders and versioned values anywhere."""
    description: str = ""
    resources: Resources = field(default_factory=Resources)
    version: str | None = None
    """An explicit version string; bump it to rerun the step with the same config."""

    def __truediv__(self, sub: str) -> Any:
        """`step / "sub"` is `output_of(step, "sub")`."""
        return OutputOf(self, sub)

    def __repr__(self) -> str:
        return f"Step({self.name!r})"


@dataclass(frozen=True)
class HangPolicy:
    """How long a step that reports progress may go without reporting before it counts as hung
    (`step_function(fn, watchdog=HangPolicy())`; the runner's watchdog, `pipeline.run.scheduler.watchdog`).

    After the first report, the bound is `factor` times the median time per unit of progress
    seen so far (a training: per step), never less than `floor`; before it, `startup` (loading,
    compiling). `Resources(hang_timeout=...)` sets one step's bound outright."""

    factor: float = 10.0
    floor: float = 120.0
    """Seconds: the least a bound ever is (a pause for a checkpoint or an evaluation is not a hang)."""
    startup: float = 1800.0
    """Seconds before the first progress report."""

    def bound(
        self, per_unit: float | None, fixed: float | None = None, *, reported: bool | None = None
    ) -> float:
        """The seconds without progress that count as hung, given the median seconds per unit of
        progress (None: not known yet), whether any progress was reported yet (default: whether
        the pace is known), and a step's own bound (`Resources.hang_timeout`)."""
        if not (per_unit is not None if reported is None else reported):
            return max(self.startup, fixed or 0.0)
        if fixed is not None:
            return fixed
        if per_unit is None:
            return self.startup
        return max(self.floor, self.factor * per_unit)


@dataclass(frozen=True)
class StepHooks:
    """What a step function declares about itself besides its code (see `step_function`)."""

    preview: Callable[[Any], Any] | None = None
    """`preview(config) -> str | Mapping | None`: what the step will do, shown by `drydock plan`
    (a mapping's keys also join the step's `--json` plan entry and its `.step.json` summary)."""
    report: Callable[[Any], Any] | None = None
    """`report(config) -> str | Mapping | None`: what the step did, for the end-of-run summary;
    recorded with the step's SUCCESS, so the dashboard shows it without the step's code."""
    metrics: Callable[[Any], Any] | None = None
    """`metrics(config) -> Mapping[str, float] | None`: the step's headline numbers (a final
    training loss, evaluation losses, task scores); recorded with its SUCCESS and compared across
    runs by `drydock compare` and the dashboard (`pipeline.observe.compare`)."""
    fresh_process: bool = False
    """Run each call in a process of its own (a step that leaves global state behind, such as
    training, must not share a worker with the next step)."""
    inputs: Callable[[Any], Any] | None = None
    """`inputs(config) -> Mapping[str, Mapping]`: the files outside the prefix the step reads
    (raw data), each by a location-independent name with a fingerprint (size, checksum). Taken
    when the step starts and recorded in `.step.json`; each later plan lists them again and notes
    on the cached step what changed ("input listing changed: 1 file modified"). Raising means
    the listing cannot be read: the step fails with that error."""
    check: Callable[[Any], Any] | None = None
    """`check(config) -> None`: the checks a step library's helper makes when it declares the step,
    for a config that did not come through the helper (a step rebuilt from a shared manifest,
    which anyone may have edited). It sees the config with versioned values unwrapped and paths
    still placeholders. Raises `ValueError("field: what is wrong")`; the engine calls it before
    anything runs and turns it into one error naming the step and field."""
    warnings: Callable[[Any], Any] | None = None
    """`warnings(config) -> list[str]`: what looks wrong but may be meant (a learning rate far
    outside any usual range), said by `drydock plan` and as a run starts, for the steps that will
    run; never raises, never stops anything."""
    compile: Callable[[Any], Any] | None = None
    """`compile(config) -> Mapping | None`: build the step's program for its declared hardware
    without running it (a training's step, compiled ahead of time) and say what it needs (memory,
    FLOPs, communication per device); `drydock plan --compile` shows it beside the preview. Raises
    `ValueError("field: why")` when the program cannot fit: the plan refuses the step in one line.
    May be slow (minutes for a large model); a step library caches what it can."""
    watchdog: HangPolicy | None = None
    """The pace the step function keeps: with a policy, the runner's watchdog watches its
    progress reports and, when they stop for longer than the policy's bound, saves every process's
    stacks, records a HUNG warning and retries the attempt (`pipeline.run.scheduler.watchdog`)."""
    estimate: Callable[[Any], Any] | None = None
    """`estimate(config) -> float | None`: the seconds the step will hold its devices, for a
    run's budget (`--budget_device_hours`, `--budget_dollars`); None when it cannot say."""


NO_HOOKS = StepHooks()
_HOOKS_ATTRIBUTE = "__drydock_step__"


F = TypeVar("F", bound=Callable[..., Any])


def step_function(
    fn: F | None = None,
    *,
    preview: Callable[[Any], Any] | None = None,
    report: Callable[[Any], Any] | None = None,
    metrics: Callable[[Any], Any] | None = None,
    fresh_process: bool = False,
    inputs: Callable[[Any], Any] | None = None,
    check: Callable[[Any], Any] | None = None,
    watchdog: HangPolicy | None = None,
    warnings: Callable[[Any], Any] | None = None,
    compile: Callable[[Any], Any] | None = None,
    estimate: Callable[[Any], Any] | None = None,
) -> Any:
    """Declare a step function and its hooks; usable bare (`@step_function`) or with arguments.

        @step_function(preview=preview, report=report, fresh_process=True)
        def train_moe(config: TrainMoeConfig) -> None: ...

    The function itself is returned unchanged (it stays importable under its own name); the hooks
    are read with `hooks_of`.
    """
    hooks = StepHooks(
        preview, report, metrics, fresh_process, inputs, check, warnings, compile, watchdog, estimate
    )

    def declare(function: F) -> F:
        setattr(function, _HOOKS_ATTRIBUTE, hooks)
        return function

    return declare(fn) if fn is not None else declare


def is_step_function(fn: Any) -> bool:
    """Whether `fn` was declared with `step_function` (what a shared recipe may run)."""
    return isinstance(getattr(fn, _HOOKS_ATTRIBUTE, None), StepHooks)


def hooks_of(fn: Callable[..., Any]) -> StepHooks:
    """The hooks `fn` was declared with (none for a plain function)."""
    hooks = getattr(fn, _HOOKS_ATTRIBUTE, NO_HOOKS)
    return hooks if isinstance(hooks, StepHooks) else NO_HOOKS
