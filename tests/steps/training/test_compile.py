"""Compile before you reserve (issue 46): a training's real train step built from abstract arrays
and compiled for its declared hardware by `drydock plan --compile`, TPU slices through libtpu's
topology descriptions on this CPU-only host; a layout that does not fit refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steps.training.compile import tpu_topology
from steps.training.roofline import collectives, matmul_flops

ROOT = Path(__file__).resolve().parents[3]
LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not LIBTPU and not os.environ.get("DRYDOCK_REQUIRE_LIBTPU"),
    reason="libtpu is not installed (`make install-tpu`; CI installs it)",
)

EXPERIMENT = """
import os
from pipeline import Resources, executor_main
from steps.data.mixture import mixture_step
from steps.data.tokenize import tokenize_step
from steps.models import TINY_MOE, MoeModelConfig
from steps.training.train_moe import MeshSpec, train_moe_step

def tok(domain):
    return tokenize_step(f"tokenized/{{domain}}", train=[f"data/corpus/{{domain}}/train-*.jsonl"],
                         validation=[f"data/corpus/{{domain}}/validation-*.jsonl"],
                         tokenizer="data/tokenizer", input_root={root!r})
mix = mixture_step("mixture/c", components={{"prose": tok("prose")}}, weights={{"prose": 1.0}},
                   target_tokens=100 * 8 * 128, batch_size=8, seq_len=128)
# About 0.9B parameters: its estimate (14.6 GiB with the vocabulary below) fits a v5e's 16 GiB, which
# the declaration accepts; XLA's temporaries do not.
BIG = MoeModelConfig(hidden_dim=2048, expert_intermediate_dim=1024, num_layers=8, num_heads=16,
                     num_kv_heads=4, num_experts=64, num_experts_per_token=4)
TPU = os.environ.get("TPU")
train = train_moe_step("train/c", data=mix, model=BIG if os.environ.get("BIG") else TINY_MOE, batch_size=8,
                       seq_len=128, num_steps=100, vocab_size=1691,
                       resources=Resources(tpu=TPU) if TPU else Resources(cpus=1),
                       mesh=MeshSpec(data=2, expert=2))
if __name__ == "__main__":
    executor_main([train])
"""


def drydock(verb: str, tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    """`drydock VERB` of the experiment above with `--compile`, its cache under `tmp_path`."""
    experiment = tmp_path / "compile_exp.py"
    experiment.write_text(EXPERIMENT.format(root=str(ROOT)))
    command = [sys.executable, "-m", "pipeline", verb, str(experiment), "--prefix", str(tmp_path / "p")]
    full_env = {**os.environ, "DRYDOCK_CACHE_DIR": str(tmp_path / "cache"), **env}
    return subprocess.run(
        [*command, "--compile", *options], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600
    )


def plan(tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    return drydock("plan", tmp_path, *options, **env)


def compiled_entry(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = [s for s in json.loads(result.stdout)["steps"] if s["name"] == "train/c"]
    return entry


@needs_libtpu
@pytest.mark.timeout(600)
def test_the_tiny_moe_compiles_for_a_v5p_slice_on_this_cpu_host(tmp_path):
    entry = compiled_entry(plan(tmp_path, "--json", TPU="v5p-8"))
    figures = entry["compiled"]
    assert figures["target"] == "TPU v5p:2x2x1 (4 chips)" and figures["devices"] == 4
    assert figures["mesh"] == "data 2 x expert 2"
    memory = figures["memory"]
    assert memory["peak"] == pytest.approx(
        memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"] + memory["code"]
    )
    # The optimizer state is donated: the new state is written where the old one was.
    assert memory["aliased"] > 0.9 * memory["outputs"]
    # Per device: its quarter of the batch. XLA counts each scanned layer's body once; the figure
    # is scaled by the program's matmuls with their loops' trips (2 layers: about twice).
    assert 1.5 < figures["loop_factor"] < 2.5
    assert figures["flops"] == pytest.approx(figures["xla_flops"] * figures["loop_factor"])
    # Within reach of 6ND: rematerialization runs the forward pass twice (8ND), attention and the
    # router are not in 6ND.
    assert 0.3 < figures["model_flops"] / figures["flops"] < 1.0
    # FSDP gathers parameters and reduces gradients; expert parallelism moves tokens.
    assert (
        figures["collectives"]["all-gather"]["count"] > 0
        and figures["collectives"]["all-reduce"]["bytes"] > 0
    )
    assert figures["roofline"]["step"] > 0 and 0 < figures["mfu"] <= 1
    # The plan's text says the same; a second plan reads it from the cache.
    again = plan(tmp_path, TPU="v5p-8")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "compiled on:                TPU v5p:2x2x1 (4 chips), mesh data 2 x expert 2 (cached)" in again.stdout
    )
    assert "compiled memory per device:" in again.stdout
    # Device time two ways: 6ND at the assumed MFU (what a budget goes by), and the compiled
    # program's roofline step time x steps x devices, a lower bound.
    hours = figures["roofline"]["step"] * entry["num_train_steps"] * 4 / 3600
    assert f"compiled device time:       {hours:,.4g} device-hours at the roofline step time" in again.stdout
    assert "device time: " in again.stdout and "on 4 v5p" in again.stdout


@needs_libtpu
@pytest.mark.timeout(600)
def test_a_layout_too_large_for_its_chips_is_refused_in_one_line(tmp_path):
    result = plan(tmp_path, TPU="v5e-4", BIG="1")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        "error: step 'train/c', field `mesh`: does not fit TPU v5e:2x2 (4 chips): XLA: "
    )
    assert "Ran out of memory" in errors[0]


@needs_libtpu
@pytest.mark.timeout(600)
def test_a_run_with_compile_refuses_before_any_step_starts(tmp_path):
    result = drydock("run", tmp_path, "--backend", "local", TPU="v5e-4", BIG="1")
    prefix = tmp_path / "p"
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: step 'train/c', field `mesh`: does not fit TPU v5e:2x2 (4 chips)" in result.stderr
    # Nothing ran, not even the data steps before the training.
    assert not list(prefix.glob("tokenized/*/.status"))


@pytest.mark.timeout(600)
def test_a_cpu_layout_compiles_on_this_host(tmp_path):
    entry = compiled_entry(plan(tmp_path, "--json"))
    figures = entry["compiled"]
    assert figures["target"] == "CPU (4 host-platform devices)" and figures["mesh"] == "data 2 x expert 2"
    assert figures["memory"]["peak"] > 0 and figures["flops"] > 0
    assert "roofline" not in figures  # no accelerator: no chip to hold it against


def test_tpu_slices_are_described_by_their_torus():
    assert tpu_topology("v5p", 4) == ("v5p:2x2x1", (2, 2, 1))
    assert tpu_topology("v5p", 32) == ("v5p:2x4x4", (2, 2, 1))
    assert tpu_topology("v5p", 1024) == ("v5p:8x8x16", (2, 2, 1))
    with pytest.raises(ValueError, match="no topology description for 'v4'"):
        tpu_topology("v4", 64)
    assert tpu_topology("v5e", 8) == ("v5e:2x4", (2, 4, 1))
    assert tpu_topology("v6e", 256) == ("v6e:16x16", (2, 2, 1))
    with pytest.raises(ValueError, match="power of two"):
        tpu_topology("v5p", 96)


HLO = """HloModule jit_train_step, entry_computation_layout={()->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  %c = s32[]{:T(128)} constant(48)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %ag = bf16[1024,64]{1,0:T(8,128)} all-gather(bf16[256,64]{1,0} %y), channel_id=1, dimensions={0}
  %ata = f32[16,32]{1,0} all-to-all(f32[16,32]{1,0} %z), channel_id=2, dimensions={0}
  %h = f32[8,32]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %w = f32[32,16]{1,0} constant({...})
  %d = f32[8,16]{1,0:T(8,128)} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %x)
}

ENTRY %main (a: f32[8]) -> f32[] {
  %a = f32[8]{0} parameter(0)
  %w = (s32[], f32[8]{0}) while(%t0), condition=%cond, body=%body, metadata={op_name="scan"}
  %rs = f32[2]{0} reduce-scatter(f32[8]{0} %a), channel_id=3, dimensions={0}, to_apply=%add
  %ars = (f32[8]{0}, f32[8]{0}) all-reduce-start(f32[8]{0} %a), channel_id=4, to_apply=%add
  %ard = f32[8]{0} all-reduce-done((f32[8]{0}, f32[8]{0}) %ars)
  ROOT %r = f32[] constant(0)
}
"""


def test_collectives_in_a_scanned_body_count_once_per_layer():
    moved = collectives(HLO)
    assert moved["all-gather"] == {"count": 48, "bytes": 48 * 1024 * 64 * 2}
    assert moved["all-to-all"] == {"count": 48, "bytes": 48 * 16 * 32 * 4}
    assert moved["reduce-scatter"] == {"count": 1, "bytes": 2 * 4}
    # An asynchronous pair is one collective, its result the last shape of the start's tuple.
    assert moved["all-reduce"] == {"count": 1, "bytes": 8 * 4}


def test_matmul_flops_count_a_scanned_body_once_per_layer():
    # XLA's cost analysis counts a loop's body once; the compile scales it by this ratio.
    with_trips, once = matmul_flops(HLO)
    assert once == 2 * 8 * 16 * 32 and with_trips == 48 * once
