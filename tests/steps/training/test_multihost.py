"""One training across hosts, for real: a Ray cluster of two worker nodes on loopback addresses,
and a gang of two hosts, each a JAX CPU process exchanging gradients through gloo, training the
tiny MoE data-parallel (issue 30).

    head   no CPUs                       (127.0.0.2)
    w1     CPU 1                         (127.0.0.3)   } the gang's two hosts
    w2     CPU 1                         (127.0.0.4)   }

Each training runs in its own `drydock run` process, as it would for a user, with every option on
its defaults (router statistics, in-training evaluation, the export): nothing is switched off for
a gang. The reference is the same training in one process (the local backend) with as many
devices as the gang has (XLA's host-platform device count): same global batch, same data, same
seed, the same data-parallel sum. Measured: the gang's losses equal that reference's bit for bit
(a two-way sum is the same in either order), so the tests allow 1e-5 relative at every logged
step. Against one process with ONE device the sums are taken in another order: the losses agree
to ~1e-7 for about 60 steps, then MoE routing amplifies the difference (a token whose two best
experts nearly tie switches expert) to ~1e-4 within ten steps and ~1e-2 by step 300 (tiny_moe,
measured) -- chaos of training, not a wrong gradient, which is why the reference has the gang's
devices.

    tiny_moe          experiments/tiny_moe.py itself, its training a gang of two
                      (DRYDOCK_TINY_HOSTS=2), with an evaluate and a task_eval following it
    gang_exp          a 30-step training of the tiny model for the failure tests (a killed host, a
                      NaN on one host, a hung host) and the other model families. The killed host's
                      gang is tensor-parallel across the processes and the hung host's gang splits
                      its experts over both: each run checks its failure, that the mesh was applied,
                      and that the retried gang resumed exactly (the losses of the data-parallel
                      reference), one gang start for two claims
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steps.training.metrics_file import read_events, read_metrics
from tests.raycluster import ray_cluster, ray_env
from tests.steps.tiny import seed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
STEPS = 30
TWO_DEVICES = "--xla_force_host_platform_device_count=2"

EXPERIMENT = """
import os
from pipeline import Resources, Step, executor_main, versioned
from steps.data.mixture import mixture_step
from steps.models import TINY_MOE, MoeModelConfig
from steps.data.tokenize import tokenize_step
from steps.training.train_moe import MeshSpec, OptimizerSpec, SpikePolicy, train_moe_step
from tests.steps.gangfns import HangingTrainConfig, PoisonedTrainConfig, hanging_train, poisoned_train

ROOT = {root!r}
STEPS = int(os.environ.get("GANG_STEPS", "{steps}"))
HOSTS = int(os.environ.get("GANG_HOSTS", "1"))
POISON = os.environ.get("GANG_POISON")  # a data batch to poison on process 1
# Four devices (two per host in a gang): the tensor axis crosses the processes (Levanter orders
# the mesh data, replica, model, expert: the last axis varies fastest, within a process), the
# expert axis of 4 spans both.
LAYOUTS = {{"tensor": MeshSpec(data=1, tensor=2, expert=2), "expert": MeshSpec(data=1, expert=4)}}
MESH = LAYOUTS.get(os.environ.get("GANG_MESH"))
FAMILIES = {{
    "qwen3_moe": TINY_MOE,
    "mixtral": MoeModelConfig(family="mixtral", qk_norm=False),
    "drydock_moe": MoeModelConfig(family="drydock_moe", num_shared_experts=1, sliding_window=32,
                                  global_every=2, num_global_kv_heads=1),
}}
MODEL = FAMILIES[os.environ.get("GANG_FAMILY", "qwen3_moe")]
# Each host's devices: a Ray worker takes its environment from the step's resources.
ENV = {{"XLA_FLAGS": os.environ["GANG_XLA_FLAGS"]}} if os.environ.get("GANG_XLA_FLAGS") else {{}}
def tok(domain):
    return tokenize_step(f"tokenized/{{domain}}", train=[f"data/corpus/{{domain}}/train-*.jsonl"],
                         validation=[f"data/corpus/{{domain}}/validation-*.jsonl"],
                         tokenizer="data/tokenizer", input_root=ROOT)
# One validation set (the smaller): training evaluates it whole every 10 steps, in both processes.
mix = mixture_step("mixture/gang", components={{"prose": tok("prose"), "arithmetic": tok("arithmetic")}},
                   weights={{"prose": 0.5, "arithmetic": 0.5}}, target_tokens=({steps} + 10) * 8 * 64,
                   batch_size=8, seq_len=64, validation=["prose"])
policy = SpikePolicy(action="rewind", skip_batches=1) if POISON else None
train = train_moe_step("train/gang", data=mix, model=MODEL, optimizer=OptimizerSpec(learning_rate=3e-3),
                       batch_size=8, seq_len=64, num_steps=STEPS, checkpoint_interval=10,
                       eval_interval=10, spike_policy=policy,
                       resources=Resources(cpus=1, hosts=HOSTS, env=ENV), mesh=MESH)
if POISON:
    train = Step("train/gang", poisoned_train,
                 PoisonedTrainConfig(train.config, process=1, batch=versioned(int(POISON))),
                 resources=train.resources)
HANG = os.environ.get("GANG_HANG")  # a marker file: process 1 hangs at step 12, once
if HANG:
    train = Step("train/gang", hanging_train,
                 HangingTrainConfig(train.config, process=1, step=12, marker=HANG),
                 resources=Resources(cpus=1, hosts=HOSTS, hang_timeout=20, env=ENV))
if __name__ == "__main__":
    executor_main([train])
"""

TINY_GANG = """
from experiments import tiny_moe as tiny
from pipeline import executor_main
from steps.evaluation.demo_tasks import DEMO_TASKS
from steps.evaluation.evaluate import evaluate_step
from steps.evaluation.task_eval import task_eval_step

# Followers: each evaluates the gang's checkpoints as they land, beside the training.
follow = evaluate_step("evaluate/tiny-follow", train=tiny.train, data=tiny.mixture, seq_len=tiny.SEQ_LEN,
                       batch_size=tiny.BATCH_SIZE, follow=True)
tasks = task_eval_step("tasks/tiny-follow", train=tiny.train, tasks=DEMO_TASKS, data_root=tiny.ROOT,
                       follow=True)
if __name__ == "__main__":
    executor_main([tiny.evaluation, tiny.tasks, follow, tasks])
"""


@pytest.fixture(scope="module")
def cluster():
    # The head's CPU runs the followers beside the gang (and the data steps before it).
    with ray_cluster([({}, None), ({}, None)], head_cpus=1) as address:
        yield address


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gang") / "gang_exp.py"
    path.write_text(EXPERIMENT.format(root=str(ROOT), steps=STEPS))
    return path


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory, experiment) -> Path:
    """The tokenized data and the mixture, made once (local backend); each test's prefix starts
    from a copy (identities do not depend on the prefix, so the copies are cached)."""
    prefix = tmp_path_factory.mktemp("data") / "prefix"
    seed(prefix)  # the demo corpus tokenized once per session (tests.steps.tiny.demo_tokens)
    result = drydock(experiment, prefix, "--backend", "local", "--only", "mixture/")
    assert result.returncode == 0, result.stderr[-3000:]
    return prefix


@pytest.fixture(scope="module")
def reference(tmp_path_factory, experiment, data_prefix) -> Path:
    """The same training in one process with the gang's two devices: the losses a gang must
    reproduce."""
    prefix = fresh_prefix(tmp_path_factory.mktemp("one"), data_prefix)
    result = drydock(experiment, prefix, "--backend", "local", env={**ray_env(), "XLA_FLAGS": TWO_DEVICES})
    assert result.returncode == 0, result.stderr[-3000:]
    return train_dir(prefix)


def fresh_prefix(where: Path, data: Path, groups=("tokenized", "mixture")) -> Path:
    prefix = where / "prefix"
    for group in groups:
        shutil.copytree(data / group, prefix / group)
    return prefix


def drydock(exp: Path, prefix: Path, *options: str, env: dict[str, str] | None = None, **kw):
    command = [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), *options]
    return subprocess.run(
        command, env=env or ray_env(), cwd=ROOT, capture_output=True, text=True, timeout=600, **kw
    )


def gang_env(**extra: str) -> dict[str, str]:
    return {**ray_env(), "GANG_HOSTS": "2", **extra}


def train_dir(prefix: Path, name: str = "train/gang") -> Path:
    (found,) = prefix.glob(f"{name}-*")
    return found


def losses(train: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r}


def each_step_once(train: Path) -> None:
    lines = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if "train/loss" in r and "event" not in r]
    assert steps == sorted(set(steps)), "a step's loss line is missing or doubled"


# See the module docstring: against one process with the gang's devices the losses are the same
# bit for bit; 1e-5 leaves room for a reduction XLA might one day split differently.
TOLERANCE = 1e-5


def close(a: dict[int, float], b: dict[int, float], steps) -> None:
    for step in steps:
        assert abs(a[step] - b[step]) <= TOLERANCE * abs(b[step]), (step, a[step], b[step])


def with_key(train: Path, prefix: str) -> dict[int, dict[str, float]]:
    """Per step, the metrics whose names start with `prefix`."""
    out: dict[int, dict[str, float]] = {}
    for row in read_metrics(str(train / "metrics.jsonl")):
        found = {k: v for k, v in row.items() if k.startswith(prefix)}
        if found:
            out[row["step"]] = found
    return out


# -- tiny_moe, as the README runs it, with its training a gang -------------------------------------


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory) -> Path:
    """tiny_moe's training in one process with two devices (and the data steps before it)."""
    prefix = tmp_path_factory.mktemp("tiny-one") / "prefix"
    env = {**ray_env(), "XLA_FLAGS": TWO_DEVICES}
    result = drydock(
        ROOT / "experiments" / "tiny_moe.py", prefix, "--backend", "local", "--only", "train/", env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return prefix


@pytest.fixture(scope="module")
def tiny_gang(cluster, tiny_reference, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The whole tiny_moe recipe on the cluster, its training a gang of two hosts, followed. Its
    data steps (17 s here) are the reference's, copied: the same identities, CACHED."""
    where = tmp_path_factory.mktemp("tiny-gang")
    experiment = where / "tiny_gang.py"
    experiment.write_text(TINY_GANG)
    prefix = fresh_prefix(where, tiny_reference, ("dedupe", "decontaminate", "tokenized", "mixture"))
    env = {**ray_env(), "DRYDOCK_TINY_HOSTS": "2"}
    return prefix, drydock(experiment, prefix, "--ray_address", cluster, env=env)


def test_tiny_moe_trains_as_a_gang_of_two_with_every_default_and_its_followers(tiny_gang, tiny_reference):
    prefix, result = tiny_gang
    assert result.returncode == 0, result.stderr[-3000:]
    train = train_dir(prefix, "train/tiny-qwen3-moe")
    one = train_dir(tiny_reference, "train/tiny-qwen3-moe")
    assert train.name == one.name  # the same training: resources are not part of an identity
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["processes"] == 2 and outcome["final_step"] == 319
    written = sorted(p.name for p in (train / ".logs").iterdir() if "-host-" in p.name)
    assert written == [
        "attempt-1-host-0.log",
        "attempt-1-host-0.pulse",
        "attempt-1-host-1.log",
        "attempt-1-host-1.pulse",
    ]
    assert "process 1 of 2 joined the gang" in (train / ".logs" / written[2]).read_text()
    mine, theirs = losses(train), losses(one)
    assert sorted(mine) == sorted(theirs) and len(mine) >= 300
    close(mine, theirs, sorted(theirs))
    each_step_once(train)
    # Router statistics every 10 steps, from the gang's global batch: the same as one process's.
    routers, expected = with_key(train, "router/"), with_key(one, "router/")
    assert sorted(routers) == sorted(expected) and len(routers) >= 30
    for step, stats in expected.items():
        for key, value in stats.items():
            assert abs(routers[step][key] - value) <= TOLERANCE * abs(value), (step, key)
    # In-training evaluation (every 80 steps) and the Hugging Face export, as in one process.
    evals = with_key(train, "eval/")
    assert sorted(evals) == sorted(with_key(one, "eval/")) and evals
    assert (train / "hf" / "step-319" / "model.safetensors").exists()
    # Both hosts' devices in the layout the leader recorded.
    layout = json.loads((train / "layout.json").read_text())
    assert sorted({process for process, _ in layout["devices"]}) == [0, 1]
    # The followers evaluated the gang's checkpoints as they landed, and the waiting evaluations
    # its final one.
    followed = json.loads(next(prefix.glob("evaluate/tiny-follow-*/results.json")).read_text())
    assert sorted(int(step) for step in followed["curve"]) == [100, 200, 300, 319]
    assert followed["checkpoint_step"] == 319
    final = json.loads(next(prefix.glob("evaluate/tiny-qwen3-moe-*/results.json")).read_text())
    assert final["checkpoint_step"] == 319
    tasks = json.loads(next(prefix.glob("tasks/tiny-follow-*/results.json")).read_text())
    assert tasks and next(prefix.glob("tasks/tiny-qwen3-moe-*/results.json")).exists()


def test_a_checkpoint_the_gang_wrote_resumes_in_one_process(tiny_gang, tiny_reference, tmp_path):
    # The checkpoint two processes wrote, resumed by one process (resharded onto its devices): the
    # loss goes on as if nothing had happened.
    prefix, result = tiny_gang
    assert result.returncode == 0, result.stderr[-3000:]
    train = train_dir(prefix, "train/tiny-qwen3-moe")
    alone = tmp_path / "prefix"
    for group in ("dedupe", "decontaminate", "tokenized", "mixture"):
        shutil.copytree(prefix / group, alone / group)
    copy = alone / train.relative_to(prefix)
    (copy / "checkpoints").mkdir(parents=True)
    shutil.copytree(train / "checkpoints" / "step-300", copy / "checkpoints" / "step-300")
    kept = [
        line for line in (train / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 300
    ]
    (copy / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    env = {**ray_env(), "XLA_FLAGS": TWO_DEVICES}
    tiny = ROOT / "experiments" / "tiny_moe.py"
    resumed = drydock(tiny, alone, "--backend", "local", "--only", "train/", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from the checkpoint at step 300" in resumed.stdout + resumed.stderr + log_text(copy)
    assert json.loads((copy / "train_result.json").read_text()).get("processes") is None
    theirs = losses(train_dir(tiny_reference, "train/tiny-qwen3-moe"))
    close(losses(copy), theirs, [step for step in sorted(theirs) if step > 300])


# -- failures in a gang ------------------------------------------------------------------------------


def log_text(train: Path) -> str:
    return "".join(p.read_text() for p in (train / ".logs").glob("*.log"))


def test_a_killed_host_retries_the_whole_gang_from_its_checkpoint(
    cluster, experiment, data_prefix, reference, tmp_path
):
    # Tensor-parallel across the two processes (see `mesh_applied`): the checkpoint the retry
    # restores is sharded over both hosts' devices.
    prefix = fresh_prefix(tmp_path, data_prefix)
    command = ["run", str(experiment), "--prefix", str(prefix), "--ray_address", cluster]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *command],
        env=gang_env(GANG_MESH="tensor", GANG_XLA_FLAGS=TWO_DEVICES),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not list(prefix.glob("train/gang-*/checkpoints/step-10/metadata.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint at step 10"
        time.sleep(0.1)
    workers = training_workers()
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)  # one host's worker dies mid-run
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    train = train_dir(prefix)
    events = [json.loads(line)["event"] for line in (train / ".status").read_text().splitlines()]
    assert events[:3] == ["RUNNING", "PREEMPTED", "RUNNING"] and events[-1] == "SUCCESS", events
    preempted = json.loads((train / ".status").read_text().splitlines()[1])["message"]
    assert "a host of the gang" in preempted or "WorkerCrashedError" in preempted, preempted
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["final_step"] == STEPS - 1 and outcome["processes"] == 2
    each_step_once(train)
    close(losses(train), losses(reference), sorted(losses(reference)))
    assert "resuming from the checkpoint at step" in log_text(train)
    mesh_applied(train, "tensor")


def training_workers() -> list[int]:
    """The pids of the Ray workers running the gang's training (Ray titles them by the task)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return sorted(int(line.split()[0]) for line in out.splitlines() if "ray::train/gang" in line)


def test_a_nan_on_one_hosts_data_rewinds_both_hosts(cluster, experiment, data_prefix, tmp_path, webhook):
    prefix = fresh_prefix(tmp_path, data_prefix)
    url, received = webhook
    result = drydock(
        experiment, prefix, "--ray_address", cluster, "--notify", url, env=gang_env(GANG_POISON="15")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    train = train_dir(prefix)
    (rewind,) = json.loads((train / "rewinds.json").read_text())["rewinds"]
    # Data batch 15 is trained at step 15: its loss is NaN on both hosts; the rewind goes back to
    # the checkpoint at step 10 and skips that batch and the next one.
    assert rewind["reason"] == "nan" and rewind["trigger_step"] == 15 and rewind["restored_step"] == 10
    assert rewind["skipped"] == [15, 16]
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["final_step"] == STEPS - 1 and outcome["interventions"]["rewinds"] == 1
    assert [e["event"] for e in read_events(str(train / "metrics.jsonl"))] == ["rewind"]
    each_step_once(train)
    # The operators heard of the rewind while it ran (issue 31, part 2), and of the run's end.
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert kinds == ["rewind", "finished"], received
    assert received[0]["body"]["text"].startswith(
        "[drydock] gang_exp: rewind train/gang: rewind 1: loss NaN at step 15: rewound to step 10"
    )
    # Both hosts left the loop at step 15 and trained on from step 11 (nothing hung).
    for host in (0, 1):
        assert (
            "resuming from the checkpoint at step 10"
            in (train / ".logs" / f"attempt-1-host-{host}.log").read_text()
        )


def mesh_applied(train: Path, layout: str) -> None:
    """The training ran on `layout` (LAYOUTS in the experiment), two host-platform devices in each
    of two processes: tensor 2 x expert 2 (the tensor axis across the processes, the expert axis
    within each) or expert 4 (the experts over both processes)."""
    # The losses alone cannot tell whether the mesh was applied (data parallelism gives the same):
    # the shardings the training's parameters had can.
    layout_used = json.loads((train / "layout.json").read_text())
    mesh, devices = layout_used["mesh"], layout_used["devices"]
    params = layout_used["parameters"]
    experts = next(p for name, p in params.items() if "experts.gate_proj" in name)
    query = next(p for name, p in params.items() if "q_proj" in name)
    names = ["data", "replica", "model", "expert", "replica_dcn"]
    grid = [[process for process, _ in devices[i : i + 2]] for i in range(0, 4, 2)]
    assert sorted(p for row in grid for p in row) == [0, 0, 1, 1]
    if layout == "tensor":
        assert {k: mesh[k] for k in names} == {
            "data": 1,
            "replica": 1,
            "model": 2,
            "expert": 2,
            "replica_dcn": 1,
        }
        # Mesh positions are model-major: the two model coordinates are the two processes.
        assert grid == [[0, 0], [1, 1]]
        # [layers, experts, embed, mlp]: experts over `expert`, the MLP width over `model`.
        assert experts["spec"][1] == ["expert"] and experts["spec"][3] == ["model"]
        assert experts["per_device"] == [2, 2, 64, 64]
        assert query["spec"][1] == ["model"]  # KV heads over the tensor axis
    else:
        assert {k: mesh[k] for k in names} == {
            "data": 1,
            "replica": 1,
            "model": 1,
            "expert": 4,
            "replica_dcn": 1,
        }
        assert experts["spec"][1] == ["expert"] and experts["per_device"] == [2, 1, 64, 128]


@pytest.mark.parametrize("family", ["mixtral", "drydock_moe"])
def test_every_family_trains_as_a_gang_with_its_defaults(cluster, experiment, data_prefix, tmp_path, family):
    # Router statistics and an evaluation at step 10, checkpoints, the export: as one process does.
    env = {"GANG_FAMILY": family, "GANG_STEPS": "12"}
    one = fresh_prefix(tmp_path / "one", data_prefix)
    alone = drydock(experiment, one, "--backend", "local", env={**ray_env(), **env, "XLA_FLAGS": TWO_DEVICES})
    assert alone.returncode == 0, alone.stderr[-3000:]
    prefix = fresh_prefix(tmp_path / "gang", data_prefix)
    result = drydock(experiment, prefix, "--ray_address", cluster, env=gang_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    train, reference = train_dir(prefix), train_dir(one)
    assert json.loads((train / "train_result.json").read_text())["processes"] == 2
    close(losses(train), losses(reference), sorted(losses(reference)))
    assert sorted(with_key(train, "router/")) == sorted(with_key(reference, "router/")) == [10]
    assert sorted(with_key(train, "eval/")) == sorted(with_key(reference, "eval/"))
    if family == "drydock_moe":
        exported = json.loads((train / "train_result.json").read_text())["export"]
        assert Path(exported, "model.safetensors").stat().st_size == (
            Path(reference / "export" / "step-11" / "model.safetensors").stat().st_size
        )
    else:
        assert (train / "hf" / "step-11" / "model.safetensors").exists()


def test_a_host_that_never_enters_the_collective_is_found_its_stacks_saved_and_the_gang_retried(
    cluster, experiment, data_prefix, reference, tmp_path, webhook
):
    # Issue 31, part 1: process 1 stops at step 12's loss instead of entering the gang's collective;
    # process 0 waits in it. Neither crashes, their leases are renewed: only the watchdog sees it.
    # The gang splits its experts over both processes (see `mesh_applied`).
    prefix = fresh_prefix(tmp_path, data_prefix)
    marker = tmp_path / "hung-once"
    url, received = webhook
    env = gang_env(GANG_HANG=str(marker), GANG_MESH="expert", GANG_XLA_FLAGS=TWO_DEVICES)
    result = drydock(experiment, prefix, "--ray_address", cluster, "--notify", url, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists()
    train = train_dir(prefix)
    events = [json.loads(line) for line in (train / ".status").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds == ["RUNNING", "WARNING", "PREEMPTED", "RUNNING", "SUCCESS"], kinds
    hung = events[1]
    assert hung["message"].startswith("HUNG: no progress for ") and " after 12 steps; " in hung["message"]
    assert hung["data"]["reached"] == {"0": 12, "1": 12}  # both finished step 11; step 12 never came
    assert "host 1 is in _stuck at gangfns.py:" in hung["message"]
    assert "host 0 waits in a collective (process_allgather)" in hung["message"]
    assert hung["data"]["suspects"] == [1] and hung["data"]["bound_seconds"] == 20
    # Found within the bound, give or take the watchdog's polls (every 5 s) and the progress
    # reports' own pace (one written every 2 s at most).
    assert hung["data"]["stalled_seconds"] < 20 + 3 * 5
    assert events[2]["message"].startswith("hung: no progress for ")
    token = events[0]["token"]
    for host in (0, 1):
        stacks = (train / ".logs" / f"attempt-{token}-host-{host}-stacks.log").read_text()
        assert stacks.startswith(f"host {host} of 2") and "step thread: 0x" in stacks
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["final_step"] == STEPS - 1 and outcome["resumed_from_step"] == 10
    each_step_once(train)
    close(losses(train), losses(reference), sorted(losses(reference)))
    mesh_applied(train, "expert")
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert kinds == ["hung", "finished"], received
    assert "host 1 is in _stuck" in received[0]["body"]["text"]
    assert received[0]["body"]["text"].endswith("; retrying from its checkpoint at step 10")
