"""The `ray` backend: each step runs as a Ray task with the step's `Resources`.

With no address (and no RAY_ADDRESS) it starts a local Ray instance for the run and shuts it
down afterwards; with an address it joins that cluster. Only dispatch lives here: leases,
status events and commits stay in the executor on the driver.

Mapping of `Resources` to Ray:
    cpus, gpus, memory, custom  -> num_cpus, num_gpus, memory, resources of the task
    env, pip                    -> runtime_env {"env_vars": ..., "pip": ...}
    tpu="v4-16", slices=N       -> per slice: a placement group on `TPU-v4-16-head` reserves a
                                   slice, then a STRICT_SPREAD placement group with one
                                   {"TPU": chips_per_host} bundle per host of that slice (by the
                                   `ray.io/tpu-slice-name` label) gang-reserves all its hosts;
                                   one task per host runs the step function. All hosts start
                                   together or none does. Multislice gets MEGASCALE_* variables.
    hosts=N (GPU or CPU hosts)  -> one STRICT_SPREAD placement group of N bundles, one host's
                                   share each (all or nothing); a probe task on bundle 0 picks
                                   a free port on host 0 for JAX's coordinator; one task per
                                   bundle runs the step function, each told its place
                                   (`pipeline.run.in_step.gang.Gang`: index, size, coordinator).

Gangs (any of the two above): each process's place is in its `StepContext` (`current_gang()`).
One host's task failing ends the whole gang at once: the other tasks are cancelled, the
placement group released, and the executor retries the gang as one attempt.

Failures: a task lost with its node (node died, slice preempted) or whose worker process died
(crashed, killed) raises `StepPreempted` (`crash=True` for a dead worker: the executor turns the
same crash over and over into a failure); an exception in the step function raises `StepFailed`
with the remote traceback. In a gang, if any host was lost the gang was preempted, whatever the
other hosts raised when their peer went away. The executor retries each on its own budget.

Fencing: while a task runs, a watcher thread in its worker re-reads the step's `.lease` every
`StepTask.lease_poll` seconds, and the worker refuses the step's file writes (`pipeline.run.in_step.fence`,
process-wide: the worker runs only this task, and threads the step starts are fenced too) once
the lease's `expires` has passed or the lease is no longer this attempt's. A live driver renews
the lease before then, so it never trips; a frozen driver stops renewing, and its worker stops
writing when the lease expires, which is when another runner may take the step over (assuming
the worker's clock is not behind that runner's by more than the time it takes to take over). A
fenced task raises `FencedWrite`, which the driver reports as `LeaseExpired`: a lost lease.

Logs: the task is named after the step, so Ray streams its output to the console prefixed
with the step name; a copy is written to `<output>/.logs/attempt-<n>[-slice-<s>-host-<h>].log`, where
<n> is the attempt's fencing token: it grows across runs, so a later run never overwrites a log.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import ray
import ray.exceptions
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pipeline.core.plan import Plan, State
from pipeline.core.tpu import TpuSlice, tpu_slice
from pipeline.errors import StepCancelled, StepDeclarationError, StepFailed, StepPreempted, StepStopped
from pipeline.run.backends.base import Backend, StepTask
from pipeline.run.backends.local_cluster import auth_env, find_cluster
from pipeline.run.backends.ray_resources import (
    SLICE_LABEL,
    follower_shortfalls,
    host_bundle,
    runtime_env,
    task_options,
    unsatisfiable,
)
from pipeline.run.backends.ray_support import (
    captured_stderr,
    check_reachable,
    free_port,
    gang_env,
    join_error,
    plain_text,
    private_ip,
    quiet_auth_notice,
)
from pipeline.run.in_step.call_step import Placement, call_step, lease_fence
from pipeline.run.in_step.fence import LeaseExpired
from pipeline.run.in_step.gang import ALONE, Gang
from pipeline.run.in_step.step_events import StepContext
from pipeline.run.options import RayOptions
from pipeline.step import hooks_of
from pipeline.storage.layout import LOGS_DIR, log_name

__all__ = ["FencedWrite", "RayBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

MEGASCALE_PORT = 8081

# Errors that mean the machine went away, not that the step function is wrong.
_HOST_LOST_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.ActorUnavailableError,
)
# ...and those that mean the step's own process died: a preemption too, but perhaps a
# deterministic one (a segfault, an out-of-memory kill at the same point every time).
_CRASH_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ActorDiedError,
    ray.exceptions.OutOfMemoryError,
)
_PREEMPTION_ERRORS = _HOST_LOST_ERRORS + _CRASH_ERRORS
GANG_SETTLE_SECONDS = 30.0
"""After a gang's first failure, how long to wait for its other tasks to end (cancelled, or
failing on their own) before telling a lost host from an exception."""


class FencedWrite(Exception):
    """Raised by a Ray task whose step tried to write after its lease expired (the write was
    refused). An `Exception`, unlike `LeaseExpired`, so that Ray reports it as the task's error."""


def _call_step(
    fn: Callable[[Any], Any],
    config: Any,
    log_path: str,
    context: StepContext,
    lease_poll: float | None = None,
    valid_until: float | None = None,
    label: str = "",
) -> None:
    """Runs on a Ray worker: the step function through `pipeline.run.in_step.call_step`, fenced by its lease,
    its output copied to the step's logs."""
    # A segfault's Python stack goes to the worker's stderr (Ray's worker log on that node).
    faulthandler.enable()
    _region_from_node()
    try:
        with lease_fence(context, lease_poll, valid_until, label) as fence:
            call_step(fn, config, context, placement=Placement.PROCESS, fence=fence, log_path=log_path)
    except LeaseExpired as e:
        raise FencedWrite(str(e)) from None


REGION_LABEL = "region"
"""The Ray node label naming the node's region (`ray start --labels '{"region": "us-central1"}'`):
steps on it read the mirror of a raw dataset in that region (`steps.data.sources`)."""


def _region_from_node() -> None:
    """`DRYDOCK_REGION` from the node's `region` label, unless the node's environment sets it."""
    if os.environ.get("DRYDOCK_REGION"):
        return
    region = ray.get_runtime_context().get_node_labels().get(REGION_LABEL)
    if region:
        os.environ["DRYDOCK_REGION"] = region  # the worker stays on this node: this stays true


def _set_env(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (None: unset) environment variables that Ray reads for authentication, and make Ray see
    them, as its own authentication_token_setup does (the mode is read into RayConfig and the token
    cached, both before the environment changed). Returns the values they had."""
    from ray._raylet import AuthenticationTokenLoader, Config

    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    return before


def _join(address: str, kwargs: dict[str, Any]) -> dict[str, str | None] | None:
    """Connect this driver to the cluster at `address`. A cluster `drydock cluster start` made on
    this machine lends its token (returns the environment to restore after the run); a refusal
    is one line, not a minute of Ray's retries and a traceback."""
    cluster = find_cluster(address)
    restore = _set_env(auth_env(cluster)) if cluster is not None else None
    failed: BaseException | None = None
    with captured_stderr() as said:
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # ConnectionError, or Ray's RuntimeErrors about versions
            failed = e
    if failed is not None:
        if restore is not None:
            _set_env(restore)
        raise join_error(address, failed, said()) from failed
    if said().strip():
        sys.stderr.write(said())  # what Ray said while joining, now that it joined
    return restore


class RayBackend(Backend):
    """Runs steps as Ray tasks on a local instance or a cluster."""

    name = "ray"
    queues = True

    @classmethod
    def create(cls, options: RayOptions, *, verbose: bool = False) -> RayBackend:
        return cls(address=options.address, num_cpus=options.num_cpus, verbose=verbose)

    @staticmethod
    def fan_out(fn: Callable[..., T], args: Sequence[tuple[Any, ...]], max_workers: int) -> Iterator[T]:
        """As Ray tasks of one CPU each, when the step runs on a Ray worker (else local processes)."""
        if not (ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE):
            yield from Backend.fan_out(fn, args, max_workers)
            return
        remote = ray.remote(num_cpus=1)(fn)
        pending = [remote.remote(*a) for a in args]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def __init__(
        self, address: str | None = None, num_cpus: int | None = None, verbose: bool = False
    ) -> None:
        address = address or os.environ.get("RAY_ADDRESS") or None
        self._owns_ray = False
        self._address = address
        self._restore_env: dict[str, str | None] | None = None
        if not ray.is_initialized():
            # Steps' output goes to their attempt logs (`.logs/`); the console gets it with --verbose.
            kwargs: dict[str, Any] = {"log_to_driver": verbose, "logging_level": logging.WARNING}
            if address:
                check_reachable(address)
                self._restore_env = _join(address, kwargs)
            else:
                # A private instance for this run ("local": never join another instance that
                # happens to run on this machine), advertised on a loopback address. Ray turns
                # token authentication on for a new instance and says so on every start; it stays
                # on, without the notice (a user's RAY_AUTH_MODE decides as always).
                quiet_auth_notice()
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    _node_ip_address=private_ip(),
                    **kwargs,
                )
            self._owns_ray = True
        # A private instance's workers run on this host, where they close their fence as soon as
        # the driver exits (`pipeline.run.in_step.call_step`); a cluster's may be anywhere (it may grow, so
        # an address counts as a cluster). An instance started before us: by its nodes now.
        self.remote_workers = bool(self._address) or (
            not self._owns_ray and sum(1 for n in ray.nodes() if n.get("Alive")) > 1
        )
        self._remote = ray.remote(_call_step)
        self._remote_fresh = ray.remote(max_calls=1)(_call_step)
        self.free_port = ray.remote(max_retries=0)(free_port)
        self._lock = threading.Lock()
        self._refs: dict[str, list[ray.ObjectRef]] = {}
        self._cancelled: set[str] = set()

    # -- planning ---------------------------------------------------------------------------------

    def default_concurrency(self) -> int:
        # Ray queues tasks by resources; this only bounds the driver threads waiting on them.
        return 256

    def describe(self) -> str:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        totals: dict[str, float] = {}
        for node in nodes:
            for key, value in (node.get("Resources") or {}).items():
                totals[key] = totals.get(key, 0.0) + value
        parts = [
            f"{totals.get(k, 0):g} {name}" for k, name in (("CPU", "CPUs"), ("GPU", "GPUs"), ("TPU", "TPUs"))
        ]
        parts = [p for p in parts if not p.startswith("0 ")]
        if not self._owns_ray or self._address:
            where = self._address or "an existing instance"
            noun = "node" if len(nodes) == 1 else "nodes"
            return f"ray: cluster at {where} ({len(nodes)} {noun}: {', '.join(parts)})"
        return f"ray: private local instance ({', '.join(parts)})"

    def validate(self, plan: Plan) -> list[str]:
        """Fail fast, naming the step, if the cluster can never satisfy what a step asks for;
        warn where a step and the steps that follow it cannot run at once."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        for label in plan.in_state(State.RUN, State.WAIT):
            node = plan.dag.nodes[label]
            problem = unsatisfiable(node.step.resources, nodes)
            if problem:
                raise StepDeclarationError(node.name, problem, field="resources")
        capacity = {
            kind: sum(float(n.get("Resources", {}).get(kind, 0)) for n in nodes) for kind in ("CPU", "GPU")
        }
        return follower_shortfalls(plan, capacity)

    # -- running ----------------------------------------------------------------------------------

    def run(self, task: StepTask) -> None:
        with self._lock:
            self._cancelled.discard(task.label)
            self._refs[task.label] = []
        try:
            if task.resources.tpu:
                self._run_tpu(task, tpu_slice(task.resources.tpu))
            elif task.resources.hosts > 1:
                self._run_hosts(task)
            else:
                options = task_options(task.resources)
                self._wait([self._submit(task, options, log_name(task.token))], task)
        finally:
            with self._lock:
                self._refs.pop(task.label, None)

    def _submit(
        self, task: StepTask, options: dict[str, Any], log_name: str, gang: Gang = ALONE
    ) -> ray.ObjectRef:
        log_path = f"{task.output_path}/{LOGS_DIR}/{log_name}"
        # A step function marked `fresh_process = True` (e.g. training, which leaves global state
        # behind in its process) gets a worker that exits after the call.
        remote = self._remote_fresh if hooks_of(task.fn).fresh_process else self._remote
        # The lease's deadline as the driver knows it now, on the wall clock the worker compares
        # `.lease`'s `expires` with.
        valid_until = time.time() + task.lease_remaining() if task.lease_remaining is not None else None
        ref = remote.options(name=task.name, max_retries=0, **options).remote(
            task.fn,
            task.config,
            log_path,
            task.context(self.name, gang),
            task.lease_poll,
            valid_until,
            task.label,
        )
        with self._lock:
            self._refs.setdefault(task.label, []).append(ref)
            cancelled = task.label in self._cancelled
        if cancelled:
            ray.cancel(ref, force=True)
        return ref

    def _wait(self, refs: list[ray.ObjectRef], task: StepTask) -> None:
        """Wait for all refs; the first failure cancels the others (a gang fails as one), and
        the gang's ending is told from what every task ended with (`_gang_error`)."""
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except BaseException as first:
                for ref in pending:
                    ray.cancel(ref, force=True)
                error = _gang_error(first, _settle(pending, GANG_SETTLE_SECONDS)) if len(refs) > 1 else first
                self._raise(task, error, len(refs) > 1 and error is not first)
        if task.label in self._cancelled:
            raise StepCancelled(task.label)

    def _raise(self, task: StepTask, error: BaseException, other_host: bool = False) -> NoReturn:
        """Translate a task's `error` into the executor's vocabulary."""
        if task.label in self._cancelled or isinstance(error, ray.exceptions.TaskCancelledError):
            raise StepCancelled(task.label) from None
        if isinstance(error, _PREEMPTION_ERRORS):
            where = "a host of the gang: " if other_host else ""
            crash = isinstance(error, _CRASH_ERRORS)
            raise StepPreempted(
                f"{where}{type(error).__name__}: {str(error).splitlines()[0]}", crash
            ) from None
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, FencedWrite):
            raise LeaseExpired(str(error.cause)) from None
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, StepStopped):
            raise StepStopped(str(error.cause)) from None  # asked to stop by its run (its budget)
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, StepPreempted):
            # The step ended itself as preempted (a training that saved its checkpoint on a
            # preemption notice): its process did not crash.
            where = "a host of the gang: " if other_host else ""
            raise StepPreempted(f"{where}{error.cause}", crash=False) from None
        if isinstance(error, ray.exceptions.RayTaskError):
            cause = error.cause
            message = f"{type(cause).__name__}: {cause}" if cause is not None else str(error).splitlines()[0]
            raise StepFailed(plain_text(message), plain_text(str(error))) from None
        raise error

    def _run_hosts(self, task: StepTask) -> None:
        """A gang of GPU or CPU hosts: every host reserved at once, one task per host."""
        resources = task.resources
        bundle = host_bundle(resources)
        group = placement_group([dict(bundle) for _ in range(resources.hosts)], strategy="STRICT_SPREAD")
        try:
            self._ready(group, task)
            host0 = _node_ip(placement_group_table(group)["bundles_to_node_id"][0])
            port = ray.get(
                self.free_port.options(
                    num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)
                ).remote()
            )
            platform = "gpu" if resources.gpus else "cpu"
            refs = []
            for h in range(resources.hosts):
                gang = Gang(index=h, size=resources.hosts, coordinator=f"{host0}:{port}", platform=platform)
                env = {**resources.env, **gang_env(gang)}
                options = task_options(resources, env)
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=h
                )
                refs.append(self._submit(task, options, log_name(task.token, host=h), gang))
            self._wait(refs, task)
        finally:
            with contextlib.suppress(Exception):
                remove_placement_group(group)

    def _run_tpu(self, task: StepTask, spec: TpuSlice) -> None:
        resources = task.resources
        groups: list[PlacementGroup] = []
        try:
            slices: list[tuple[str, PlacementGroup]] = []
            for _ in range(resources.slices):
                # Reserve a whole slice through its head host, then gang-reserve all its hosts.
                head = placement_group([{spec.head_resource: 1}])
                groups.append(head)
                self._ready(head, task)
                name = _slice_of(placement_group_table(head)["bundles_to_node_id"][0])
                bundle = {"TPU": float(spec.chips_per_host), "CPU": float(resources.cpus)}
                hosts = placement_group(
                    [dict(bundle) for _ in range(spec.hosts)],
                    strategy="STRICT_SPREAD",
                    bundle_label_selector=[{SLICE_LABEL: name} for _ in range(spec.hosts)],
                )
                groups.append(hosts)
                self._ready(hosts, task)
                slices.append((name, hosts))
            coordinator = _node_ip(placement_group_table(slices[0][1])["bundles_to_node_id"][0])
            refs = []
            for s, (name, group) in enumerate(slices):
                for h in range(spec.hosts):
                    # JAX finds the other processes of a TPU slice itself: no coordinator here.
                    gang = Gang(index=s * spec.hosts + h, size=resources.slices * spec.hosts, platform="tpu")
                    env = {
                        **resources.env,
                        **gang_env(gang),
                        "DRYDOCK_TPU_TYPE": spec.type,
                        "DRYDOCK_TPU_SLICE_NAME": name,
                        "DRYDOCK_TPU_SLICE_ID": str(s),
                        "DRYDOCK_TPU_HOST_ID": str(h),
                        "DRYDOCK_TPU_NUM_HOSTS": str(spec.hosts),
                    }
                    if resources.slices > 1:
                        env.update(
                            MEGASCALE_COORDINATOR_ADDRESS=f"{coordinator}:{MEGASCALE_PORT}",
                            MEGASCALE_NUM_SLICES=str(resources.slices),
                            MEGASCALE_SLICE_ID=str(s),
                            MEGASCALE_PORT=str(MEGASCALE_PORT),
                        )
                    options = {
                        "num_cpus": resources.cpus,
                        "resources": {"TPU": float(spec.chips_per_host), **resources.custom},
                        "scheduling_strategy": PlacementGroupSchedulingStrategy(
                            group, placement_group_bundle_index=h
                        ),
                        "runtime_env": runtime_env(resources, env),
                    }
                    refs.append(self._submit(task, options, log_name(task.token, s, h), gang))
            self._wait(refs, task)
        finally:
            for group in groups:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)

    def _ready(self, group: PlacementGroup, task: StepTask) -> None:
        """Wait until a placement group is reserved; stop waiting if the step is cancelled."""
        while True:
            ready, _ = ray.wait([group.ready()], timeout=1.0)
            if ready:
                return
            if task.label in self._cancelled:
                raise StepCancelled(task.label)

    def cancel(self, label: str) -> None:
        with self._lock:
            self._cancelled.add(label)
            refs = list(self._refs.get(label, ()))
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._restore_env is not None:  # a later Ray of this process is not this cluster's
            _set_env(self._restore_env)
            self._restore_env = None


def _settle(refs: list[ray.ObjectRef], timeout: float) -> list[BaseException]:
    """What the tasks of `refs` (just cancelled) ended with, waiting at most `timeout` seconds."""
    errors = []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
    for ref in ready:
        try:
            ray.get(ref)
        except BaseException as e:
            errors.append(e)
    return errors


def _gang_error(first: BaseException, others: list[BaseException]) -> BaseException:
    """What a gang ended with: a lost host if any task lost its host or its process (the others
    then fail on their own, in a collective whose peer went away: not the step's fault);
    otherwise the first failure. Cancellations of the other tasks are the gang's own doing."""
    for error in (first, *others):
        if isinstance(error, _HOST_LOST_ERRORS):
            return error
    for error in (first, *others):
        if isinstance(error, _CRASH_ERRORS):
            return error
    return first


def _node(node_id: str) -> dict[str, Any]:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node
    raise StepPreempted(f"node {node_id} left the cluster")


def _slice_of(node_id: str) -> str:
    node = _node(node_id)
    name = (node.get("Labels") or {}).get(SLICE_LABEL)
    if not name:
        raise StepFailed(f"TPU head node {node['NodeManagerAddress']} has no {SLICE_LABEL!r} label")
    return name


def _node_ip(node_id: str) -> str:
    return _node(node_id)["NodeManagerAddress"]
