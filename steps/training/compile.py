"""Compile a training's step for its declared hardware before anything is reserved.

    compile_layout(config) -> {"compiled": {...figures}, "compiled memory per device": "...", ...}
    python -m steps.training.compile CONFIG.pickle OUT.json     (the worker it starts)

The program is the real one: Levanter's train step (`Trainer._train_step`: the loss, its gradient
and the optimizer's update) over the training's own model, optimizer state, mesh, precision and
global batch, built from abstract arrays (`jax.ShapeDtypeStruct` with their shardings: nothing
is allocated) and compiled with `jit(...).lower(...).compile()` without running. Where:

    TPU   `Resources(tpu="v5p-64")`: on any host, for the slice's topology (libtpu's topology
          descriptions; `make install-tpu` installs libtpu), every chip one device
    CPU   no accelerator: on this host's CPU, with as many host-platform devices as the mesh has
    GPU   compiled only where JAX sees GPUs; elsewhere the plan keeps its arithmetic estimate and
          says so

XLA reports per device its arguments, outputs, temporaries and generated code
(`memory_analysis()`; the peak is arguments + outputs + temporaries + code - aliased, what it
must hold at once), the FLOPs and bytes it will move (`cost_analysis()`); the program's text gives
the collectives (`steps.training.roofline.collectives`) and a roofline turns all of it into a step
time and an MFU. A layout that does not fit is refused by XLA itself at compile time ("Ran out of
memory in memory space hbm") or by the peak against the chip's HBM: `ValueError("mesh: ...")`,
which `drydock plan --compile` turns into one line naming the step.

Results are cached by everything the program is made of (model, optimizer, guards, batch, length,
precision, mesh, hardware, vocabulary, JAX and libtpu versions, this module's revision) under
`compiled/` in Drydock's cache (`$DRYDOCK_CACHE_DIR`, default `~/.cache/drydock`), so a second
plan is instant.
The compile runs in a process of its own: it sets JAX's platform and flags for the target, and
the hero's abstract program takes host memory the planning process should not keep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any

from pipeline.steplib import cache_dir, format_size
from steps.data.mixture import tokenizer_size_if_known
from steps.models import parameter_counts
from steps.training.config import TrainMoeConfig
from steps.training.estimates import ACCELERATORS, Hardware, memory_per_device
from steps.training.mesh import MeshSpec

__all__ = ["REVISION", "TPU_GENERATIONS", "compile_layout", "tpu_topology"]

REVISION = 2
"""Bumped when what the compile builds or reports changes: cached results from before are not reused."""

TPU_GENERATIONS = {"v5p": 3, "v5e": 2, "v6e": 2}
"""TPU generations compiled for, and the dimensions of their torus. Not v4: libtpu describes its
chips as two devices each (its cores), where a v4 slice trains with one per chip (megacore)."""


def tpu_topology(generation: str, chips: int) -> tuple[str, tuple[int, int, int]]:
    """libtpu's topology name for a slice of `chips` chips (e.g. `v5p:4x4x4`) and its hosts'
    chip bounds: the torus grown by doubling its smallest side, as Cloud TPU's slice shapes are."""
    dims = TPU_GENERATIONS.get(generation)
    if dims is None:
        raise ValueError(
            f"resources.tpu: no topology description for {generation!r} (only {sorted(TPU_GENERATIONS)})"
        )
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"resources.tpu: {chips} chips is not a power of two; give the topology by hand")
    if chips < 4:
        shape = [1] * dims
        shape[0] = chips
    else:
        shape = [2, 2] + [1] * (dims - 2)
        while math.prod(shape) < chips:  # 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...
            smallest = min(range(dims), key=lambda i: (shape[i], -i))
            shape[smallest] *= 2
    host = (2, 2, 1) if chips >= 4 else (shape[0], 1, 1)
    if dims == 2 and chips <= 8:  # v5e/v6e hosts hold up to 8 chips in small slices
        host = (shape[0], shape[1], 1)
    return f"{generation}:{'x'.join(map(str, shape))}", host


# -- the hook: cache, then a worker process -----------------------------------------------------


def compile_layout(config: TrainMoeConfig) -> dict[str, Any]:
    """The compiled figures of `config`'s training step on its hardware (see the module docstring);
    raises ValueError("field: ...") when the layout cannot be built or does not fit."""
    hardware = config.hardware or Hardware()
    vocab = config.vocab_size or _vocab_of(config)
    if vocab is None:
        raise ValueError(
            "vocab_size: the vocabulary is needed to build the program; set vocab_size in the "
            "declaration, or make the data first"
        )
    spec = hardware.spec
    if spec is not None and spec.name == "v4":
        return {
            "compiled": {"estimate_only": True},
            "compiled on": "not compiled: libtpu describes a v4 chip as two devices, where a v4 slice "
            "trains with one per chip (the figures above are the estimate)",
        }
    if spec is not None and hardware.accelerator not in TPU_GENERATIONS and not _gpus_here():
        return {
            "compiled": {"estimate_only": True},
            "compiled on": f"not compiled: no {spec.name} GPU here (the figures above are the estimate)",
        }
    key = _cache_key(config, vocab)
    cached = _cache_path(key)
    if os.path.exists(cached):
        with open(cached) as f:
            figures = json.load(f)
        figures["cached"] = True
    else:
        figures = _compile_in_worker(config, vocab)  # a refusal is as deterministic: kept too
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(cached), delete=False) as f:
            json.dump(figures, f, indent=1)
        os.replace(f.name, cached)
    if "refused" in figures:
        raise ValueError(f"mesh: {figures['refused']}")
    return _shown(config, vocab, figures)


def _gpus_here() -> bool:
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() not in ("", "0")


def _vocab_of(config: TrainMoeConfig) -> int | None:
    return tokenizer_size_if_known(config.data) if config.data else None


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("jax", "jaxlib", "libtpu", "marin-levanter"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = ""
    return out


def _cache_key(config: TrainMoeConfig, vocab: int) -> str:
    made_of = {
        "revision": REVISION,
        "versions": _versions(),
        "vocab": vocab,
        **{
            name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            for name, value in (
                ("model", config.model),
                ("optimizer", config.optimizer),
                ("stability", config.stability),
                ("spike_policy", config.spike_policy),
                ("batch_size", config.batch_size),
                ("seq_len", config.seq_len),
                ("precision", config.precision),
                ("mesh", config.mesh or MeshSpec()),
                ("hardware", config.hardware or Hardware()),
            )
        },
    }
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _cache_path(key: str) -> str:
    return cache_dir("compiled", f"{key}.json")


def _compile_in_worker(config: TrainMoeConfig, vocab: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="drydock-compile-") as scratch:
        given, result = os.path.join(scratch, "config.pickle"), os.path.join(scratch, "figures.json")
        with open(given, "wb") as f:
            pickle.dump((config, vocab), f)
        env = dict(os.environ)
        env.update(_worker_env(config))
        done = subprocess.run(
            [sys.executable, "-m", "steps.training.compile", given, result],
            env=env,
            capture_output=True,
            text=True,
        )
        if not os.path.exists(result):
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"the compile worker exited with {done.returncode}:\n{tail}")
        with open(result) as f:
            return json.load(f)


def _worker_env(config: TrainMoeConfig) -> dict[str, str]:
    """The worker's JAX settings: for a TPU (described, not attached) or the CPU, CPU as JAX's
    platform and libtpu allowed beside other JAX processes; for the CPU as many host-platform
    devices as the mesh needs; for GPUs, JAX as it is (it finds them)."""
    hardware = config.hardware or Hardware()
    if hardware.accelerator is not None and hardware.accelerator not in TPU_GENERATIONS:
        return {}
    env = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"}
    if hardware.accelerator is None:
        devices = _cpu_devices(config)
        flags = os.environ.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _cpu_devices(config: TrainMoeConfig) -> int:
    mesh = config.mesh or MeshSpec()
    return mesh.devices_fixed if mesh.data > 0 else max(mesh.devices_fixed, 1)


# -- what the plan shows ------------------------------------------------------------------------


def _shown(config: TrainMoeConfig, vocab: int, figures: dict[str, Any]) -> dict[str, Any]:
    """The compiled figures as plan lines, beside the arithmetic estimate; `compiled` keeps the
    numbers for `plan --json`."""
    devices = figures["devices"]
    memory = figures["memory"]
    peak = memory["peak"]
    spec = ACCELERATORS.get(figures["accelerator"] or "")
    of = f" of {format_size(spec.memory)} ({peak / spec.memory:.0%})" if spec else ""
    estimate = memory_per_device(
        config.model,
        vocab,
        config.batch_size,
        config.seq_len,
        config.mesh or MeshSpec(),
        devices,
        config.precision,
    )["total"]
    figures = {**figures, "estimate_memory": estimate}
    out: dict[str, Any] = {"compiled": figures}
    cached = " (cached)" if figures.get("cached") else f" in {figures['seconds']:.0f} s"
    out["compiled on"] = f"{figures['target']}, mesh {figures['mesh']}{cached}"
    out["compiled memory per device"] = (
        f"{format_size(peak)}{of}: arguments {format_size(memory['arguments'])}, outputs "
        f"{format_size(memory['outputs'])} ({format_size(memory['aliased'])} of them donated), "
        f"temporaries {format_size(memory['temporaries'])}, code {format_size(memory['code'])}; "
        f"estimate {format_size(estimate)} ({_percent(estimate, peak)})"
    )
    model_flops = figures["model_flops"]
    out["compiled FLOPs per device"] = (
        f"{figures['flops']:.3g} per step (XLA's {figures['xla_flops']:.3g}, its loops' bodies once, x "
        f"{figures['loop_factor']:.2f} for their trips); 6ND {model_flops:.3g} "
        f"({_percent(model_flops, figures['flops'])})"
    )
    moved = figures["collectives"]
    out["collectives per step"] = (
        ", ".join(
            f"{kind} {int(c['count'])} ({format_size(c['bytes'])})" for kind, c in sorted(moved.items())
        )
        or "none"
    )
    times = figures.get("roofline")
    if times:
        out["compiled step time"] = (
            f"{times['step']:.3g} s (compute {times['compute']:.3g}, memory {times['memory']:.3g}, "
            f"communication {times['communication']:.3g}): MFU {figures['mfu']:.0%} at best overlap "
            f"{figures['mfu_overlapped']:.0%}"
        )
        # Beside the plan's `device time` (6ND at an assumed MFU, what a budget goes by): the
        # compiled program's, at its roofline step time, a lower bound.
        hours = times["step"] * config.num_steps * devices / 3600
        out["compiled device time"] = f"{hours:,.4g} device-hours at the roofline step time (a lower bound)"
    return out


def _percent(estimate: float, compiled: float) -> str:
    if not compiled:
        return "n/a"
    return f"{(estimate - compiled) / compiled:+.0%} against compiled"


# -- the worker ---------------------------------------------------------------------------------


def _devices(config: TrainMoeConfig) -> tuple[list[Any], str, str | None, int]:
    """The devices to compile for, a description of them, the accelerator's name, the slices."""
    import jax

    hardware = config.hardware or Hardware()
    if hardware.accelerator is None:
        devices = jax.devices("cpu")
        return devices, f"CPU ({len(devices)} host-platform devices)", None, 1
    if hardware.accelerator in TPU_GENERATIONS:
        from jax.experimental import topologies

        slices = hardware.slices
        chips = (hardware.devices or 0) // slices
        name, host = tpu_topology(hardware.accelerator, chips)
        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=name,
            chip_config_name="default",
            chips_per_host_bounds=host,
            num_slices=slices,
        )
        where = f"TPU {name} ({chips} chips" + (f" x {slices} slices)" if slices > 1 else ")")
        return list(topology.devices), where, hardware.accelerator, slices
    devices = jax.devices("gpu")
    return devices, f"{len(devices)} {hardware.accelerator} GPUs", hardware.accelerator, 1


def compile_here(config: TrainMoeConfig, vocab: int) -> dict[str, Any]:
    """Build and compile the train step in this process (the worker's job): the figures, or
    `{"refused": why}` when XLA finds it does not fit."""
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import jax.random as jrandom
    import jmp
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from jax.sharding import NamedSharding, PartitionSpec
    from levanter.data.text.examples import GrugLmExample, named_lm_example_from_grug
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig
    from levanter.trainer_state import TrainerState
    from levanter.utils.mesh import create_mesh_from_axis_specs

    from steps.models import to_levanter
    from steps.training.levanter_config import levanter_optimizer
    from steps.training.roofline import collectives, matmul_flops, roofline, summarize_costs

    started = time.time()
    devices, where, accelerator, slices = _devices(config)
    mesh_config = (config.mesh or MeshSpec()).to_levanter()
    ici, dcn = mesh_config.axis_shapes(len(devices), slices)
    if slices > 1:
        dcn = {**dcn, "replica_dcn": slices}
    mesh = create_mesh_from_axis_specs(ici_axes=ici, dcn_axes=dcn, devices=devices)
    policy = jmp.get_policy("p=f32,c=bfloat16" if config.precision == "bf16" else "f32")
    trainer_config = TrainerConfig(
        mesh=mesh_config,
        train_batch_size=config.batch_size,
        num_train_steps=config.num_steps,
        mp=policy,
        id="compile",
        tracker=NoopConfig(),
        require_accelerator=False,
        seed=config.seed,
    )
    optimizer = levanter_optimizer(config.optimizer, config.stability, config.spike_policy).build(
        config.num_steps
    )
    model_config = to_levanter(config.model, config.seq_len, None)
    z_loss = config.stability.z_loss

    def loss_function(model: Any, example: Any, *, key: Any = None) -> Any:
        return model.compute_next_token_loss(example, key=key, logsumexp_weight=z_loss)

    class _Trainer(Trainer):  # the mesh of the described devices, not of this host's
        @property
        def device_mesh(self) -> Any:
            return mesh

    params, compute = mesh_config.resolved_param_mapping, mesh_config.resolved_compute_mapping
    replicated = NamedSharding(mesh, PartitionSpec())
    # On this host: eager work under the mesh would run on its (described) devices.
    model_key, training_key = jrandom.split(jrandom.PRNGKey(config.seed), 2)
    with _compile_time_constants(), hax.partitioning.set_mesh(mesh), hax.axis_mapping(params):
        trainer = _Trainer(trainer_config, optimizer, loss_function, add_default_hooks=False)
        Vocab = round_axis_for_partitioning(Axis("vocab", vocab), params)
        Batch, Pos = Axis("batch", config.batch_size), model_config.max_Pos.resize(config.seq_len)

        def init_state(model_key: Any, training_key: Any) -> Any:
            model = model_config.build(Vocab, key=model_key)
            return TrainerState.init(optimizer, model, key=training_key, is_trainable=True, mp=policy)

        state_shape = eqx.filter_eval_shape(init_state, model_key, training_key)
        state_dynamic, state_static = eqx.partition(state_shape, _is_abstract)

        def make_batch(tokens: Any) -> Any:
            examples = jax.vmap(lambda t: GrugLmExample.causal(tokens=t, eos_id=0))(tokens)
            return named_lm_example_from_grug(examples, Pos, Batch)

        batch_shape = eqx.filter_eval_shape(
            make_batch, jax.ShapeDtypeStruct((Batch.size, Pos.size), jnp.int32)
        )
        batch_dynamic, batch_static = eqx.partition(batch_shape, _is_abstract)
        state_shardings = _with_default(
            hax.partitioning.infer_resource_partitions(state_dynamic, params, mesh), replicated
        )
        batch_shardings = _with_default(
            hax.partitioning.infer_resource_partitions(batch_dynamic, compute, mesh), replicated
        )

        def train_step(state_dynamic: Any, batch_dynamic: Any) -> Any:
            state = eqx.combine(state_dynamic, state_static)
            batch = eqx.combine(batch_dynamic, batch_static)
            result = trainer._train_step(state, (batch,), {}, _no_hooks=True)
            return result.loss, eqx.filter(result.new_state, eqx.is_array)

        step = jax.jit(
            train_step,
            in_shardings=(state_shardings, batch_shardings),
            out_shardings=(replicated, state_shardings),
            donate_argnums=0,
        )
        abstract_state = _placed(state_dynamic, state_shardings)
        abstract_batch = _placed(batch_dynamic, batch_shardings)
        lowered = step.lower(abstract_state, abstract_batch)
        try:
            compiled = lowered.compile()
        except Exception as e:  # XLA's own refusal: a program that cannot fit its devices
            text = str(e)
            if "Ran out of memory" in text or "RESOURCE_EXHAUSTED" in text:
                first = next((line for line in text.splitlines() if "memory" in line.lower()), text)
                return {"refused": f"does not fit {where}: XLA: {first.strip()[:300]}"}
            raise
    analysis = compiled.memory_analysis()
    memory = {
        "arguments": float(analysis.argument_size_in_bytes),
        "outputs": float(analysis.output_size_in_bytes),
        "aliased": float(analysis.alias_size_in_bytes),
        "temporaries": float(analysis.temp_size_in_bytes),
        "code": float(analysis.generated_code_size_in_bytes),
    }
    memory["peak"] = (
        memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"] + memory["code"]
    )
    costs = summarize_costs(compiled.cost_analysis())
    program = compiled.as_text()
    if os.environ.get("DRYDOCK_COMPILE_HLO"):  # the optimized program, for reading by hand
        with open(os.environ["DRYDOCK_COMPILE_HLO"], "w") as f:
            f.write(program)
    moved = collectives(program)
    # XLA's cost analysis counts a loop's body once (a scan over layers: about one layer); the
    # program's own matmuls, counted with and without their loops' trips, scale it to a step.
    with_trips, once = matmul_flops(program)
    loops = with_trips / once if once else 1.0
    total, active = parameter_counts(config.model, vocab)
    model_flops = 6 * active * config.batch_size * config.seq_len / len(devices)
    figures: dict[str, Any] = {
        "target": where,
        "accelerator": accelerator,
        "devices": len(devices),
        "mesh": " x ".join(f"{name} {size}" for name, size in mesh.shape.items() if size > 1) or "1 device",
        "memory": memory,
        "flops": costs["flops"] * loops,
        "bytes_accessed": costs["bytes accessed"] * loops,
        "xla_flops": costs["flops"],
        "loop_factor": loops,
        "model_flops": model_flops,
        "collectives": moved,
        "parameters": {"total": total, "active": active},
        "seconds": time.time() - started,
    }
    spec = ACCELERATORS.get(accelerator or "")
    if spec is not None:
        if memory["peak"] > spec.memory:
            return {
                "refused": f"needs {format_size(memory['peak'])} per device (compiled for {where}), "
                f"more than a {spec.name}'s {format_size(spec.memory)}: shard more (data, tensor, "
                "expert), use more devices, or a smaller batch"
            }
        moved_bytes = sum(c["bytes"] for c in moved.values())
        times = roofline(
            figures["flops"], figures["bytes_accessed"], moved_bytes, spec, across_slices=slices > 1
        )
        figures["roofline"] = times
        figures["mfu"] = model_flops / (spec.peak_flops * times["step"]) if times["step"] else 0.0
        overlapped = max(times["compute"], times["memory"], times["communication"])
        figures["mfu_overlapped"] = model_flops / (spec.peak_flops * overlapped) if overlapped else 0.0
    return figures


def _is_abstract(x: Any) -> bool:
    import jax

    return isinstance(x, jax.ShapeDtypeStruct)


def _with_default(shardings: Any, default: Any) -> Any:
    """Every leaf a sharding: the arrays haliax leaves unnamed (the step count, the keys) replicated."""
    import jax

    return jax.tree.map(lambda s: default if s is None else s, shardings, is_leaf=lambda s: s is None)


def _placed(tree: Any, shardings: Any) -> Any:
    """Each abstract array of `tree` with its sharding (haliax gives one per NamedArray)."""
    import haliax as hax
    import jax

    def place(sharding: Any, x: Any) -> Any:
        if x is None:  # a static part, partitioned out
            return None
        if isinstance(x, hax.NamedArray):
            return hax.NamedArray(
                jax.ShapeDtypeStruct(x.array.shape, x.array.dtype, sharding=sharding), x.axes
            )
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(place, shardings, tree, is_leaf=lambda s: s is None)


@contextlib.contextmanager
def _compile_time_constants() -> Any:
    """Run no operation eagerly while the program is built: the mesh's devices may be described,
    not attached ("'Executable' object has no attribute 'local_devices'"). Levanter's rotary
    embedding computes its tables eagerly (`jax.ensure_compile_time_eval`): traced instead, they
    become constants XLA folds, the same program. haliax asks whether it is inside `jit` by
    making an array (`is_in_jit`): the trace state says it without one."""
    import haliax.jax_utils
    import haliax.partitioning
    import jax
    from jax._src import core

    def is_in_jit() -> bool:
        return not core.trace_state_clean()

    saved = (jax.ensure_compile_time_eval, haliax.jax_utils.is_in_jit, haliax.partitioning.is_in_jit)
    jax.ensure_compile_time_eval = contextlib.nullcontext  # type: ignore[assignment]
    haliax.jax_utils.is_in_jit = haliax.partitioning.is_in_jit = is_in_jit
    try:
        yield
    finally:
        jax.ensure_compile_time_eval, haliax.jax_utils.is_in_jit, haliax.partitioning.is_in_jit = saved


def main(argv: list[str]) -> int:
    """The worker: unpickle (config, vocab), compile, write the figures as JSON."""
    given, result = argv
    with open(given, "rb") as f:
        config, vocab = pickle.load(f)
    figures = compile_here(config, vocab)
    with open(result, "w") as f:
        json.dump(figures, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
