"""Mirrors in two regions (two moto buckets): reading the local one, the cross-region budget, and
the mirror step copying a dataset resumably after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from steps.data.mirror import mirror_step
from steps.data.sources import raw_dataset
from steps.data.tokenize import tokenize_step
from tests.s3server import s3_bucket_environment
from tests.steps.conftest import make_docs, write_jsonl

ROOT = Path(__file__).resolve().parents[3]
US, EU = "drydock-mirror-us", "drydock-mirror-eu"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    import fsspec

    with s3_bucket_environment(US) as variables:
        fsspec.filesystem("s3").mkdir(EU)
        yield variables


@pytest.fixture
def run_dir(s3) -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def put(bucket: str, path: str, data: bytes) -> None:
    import fsspec

    fsspec.filesystem("s3").pipe_file(f"{bucket}/{path}", data)


def test_a_step_reads_the_location_in_its_region_within_a_budget(
    run_dir, tmp_path, tokenizer_dir, monkeypatch
):
    local = write_jsonl(tmp_path / "part-0.jsonl", make_docs(40))
    put(EU, f"{run_dir}/web/part-0.jsonl", local.read_bytes())  # only the EU copy exists yet
    web = raw_dataset(
        "web",
        version="1",
        urls={"us-east1": f"s3://{US}/{run_dir}/web", "europe-west4": f"s3://{EU}/{run_dir}/web"},
        cross_region_budget=1000,
    )

    def tokenize(prefix: str):
        step = tokenize_step("tokenized/web", train=[web], tokenizer=tokenizer_dir)
        return run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / prefix), backend="local"))

    monkeypatch.setenv("DRYDOCK_REGION", "europe-west4")
    assert tokenize("eu").ok  # read from the EU location: the US one is empty
    monkeypatch.setenv("DRYDOCK_REGION", "asia-east1")  # no mirror here: the first, across regions
    put(US, f"{run_dir}/web/part-0.jsonl", local.read_bytes())
    report = tokenize("asia")
    assert not report.ok
    (outcome,) = report.outcomes.values()
    size = local.stat().st_size
    assert (
        f"dataset 'web': reading {size:,} bytes from s3://{US}/{run_dir}/web (region us-east1) in region "
        f"asia-east1 is over its cross-region budget of 1,000 bytes" in (outcome.error or "")
    )
    assert not list((tmp_path / "asia").glob("tokenized/web-*/stats.json"))


MIRROR_EXPERIMENT = """
from pipeline import executor_main
from steps.data.mirror import mirror_step
from steps.data.sources import raw_dataset

web = raw_dataset("web", version="1", urls={{"us": "s3://{us}/{run}/web", "eu": "s3://{eu}/{run}/web"}})
executor_main([mirror_step("mirror/web-eu", dataset=web, to="s3://{eu}/{run}/web", budget={budget})])
"""


def test_the_mirror_step_resumes_after_sigkill_and_verifies_every_file(s3, run_dir, tmp_path):
    import fsspec

    fs = fsspec.filesystem("s3")
    files = 300
    for i in range(files):
        put(US, f"{run_dir}/web/shard-{i:04d}.jsonl", f'{{"text": "document {i}"}}\n'.encode() * (i % 7 + 1))
    exp = tmp_path / "mirror_exp.py"
    exp.write_text(MIRROR_EXPERIMENT.format(us=US, eu=EU, run=run_dir, budget=10**6))
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        str(exp),
        "--prefix",
        str(tmp_path / "p"),
        "--backend",
        "local",
    ]
    env = {**os.environ, **s3, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while len(fs.ls(f"{EU}/{run_dir}/web", refresh=True) if fs.exists(f"{EU}/{run_dir}/web") else []) < 30:
        assert time.monotonic() < deadline and proc.poll() is None, "the mirror never got going"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    copied_before = len(fs.ls(f"{EU}/{run_dir}/web", refresh=True))
    assert 30 <= copied_before < files

    rerun = subprocess.run([*cmd, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (out,) = (tmp_path / "p" / "mirror").glob("web-eu-*")
    done = json.loads((out / "mirror.json").read_text())
    assert (
        done["files"] == files
        and done["already_there"] >= copied_before
        and done["copied"] == files - done["already_there"]
    )
    assert set(done["verified_by"]) == {"checksum"}  # moto keeps MD5 ETags: every copy checked by content
    us = {p.rsplit("/", 1)[1]: i["ETag"] for p, i in fs.find(f"{US}/{run_dir}/web", detail=True).items()}
    eu = {p.rsplit("/", 1)[1]: i["ETag"] for p, i in fs.find(f"{EU}/{run_dir}/web", detail=True).items()}
    assert us == eu and len(eu) == files


def test_a_mirror_over_its_budget_copies_nothing(s3, run_dir, tmp_path):
    import fsspec

    put(US, f"{run_dir}/web/a.jsonl", b'{"text": "x"}\n' * 100)
    web = raw_dataset("web", version="1", urls=[f"s3://{US}/{run_dir}/web"])
    step = mirror_step("mirror/web", dataset=web, to=f"s3://{EU}/{run_dir}/web", budget=100)
    report = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"))
    assert not report.ok
    (outcome,) = report.outcomes.values()
    assert "mirror of dataset 'web': 1,400 bytes to copy" in (outcome.error or "")
    assert "over its budget of 100 bytes (field `budget`)" in (outcome.error or "")
    assert not fsspec.filesystem("s3").exists(f"{EU}/{run_dir}/web/a.jsonl")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"source": "s3://elsewhere/x"}, "source"),
        ({"budget": -1}, "budget"),
        ({"to": ""}, "to"),
        ({"dataset": "s3://b/x"}, "dataset"),
    ],
)
def test_bad_mirror_declarations_name_the_field(kwargs, field):
    web = raw_dataset("web", version="1", urls=["s3://b/raw/web"])
    with pytest.raises(StepDeclarationError) as info:
        mirror_step("mirror/bad", **{"dataset": web, "to": "s3://c/raw/web", **kwargs})
    assert info.value.field == field


LOCAL_MIRROR = """
import sys
from pipeline import executor_main
from steps.data.mirror import mirror_step
from steps.data.sources import raw_dataset

web = raw_dataset("web", version=sys.argv.pop(1), urls=["{src}"])
executor_main([mirror_step("mirror/web", dataset=web, to="{dst}")])
"""


def test_a_file_fixed_in_place_with_the_same_size_is_mirrored_again(tmp_path):
    # On local disk no store keeps a checksum: comparing sizes alone kept the old bytes (issue 29).
    src, dst, prefix = tmp_path / "src", tmp_path / "dst", tmp_path / "p"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "a typo"}\n')
    (src / "b.jsonl").write_text('{"text": "fine"}\n')
    exp = tmp_path / "mirror_local.py"
    exp.write_text(LOCAL_MIRROR.format(src=src, dst=dst))

    def mirror(version: str, *extra: str) -> dict:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DRYDOCK_CACHE_DIR": str(tmp_path / "cache")}
        command = [sys.executable, "-m", "pipeline", "run", str(exp), version, "--prefix", str(prefix)]
        result = subprocess.run(
            [*command, "--backend", "local", *extra], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        newest = max((prefix / "mirror").glob("web-*/mirror.json"), key=lambda p: p.stat().st_mtime_ns)
        return json.loads(newest.read_text())

    first = mirror("1")
    assert (first["copied"], first["already_there"]) == (2, 0)
    (src / "a.jsonl").write_text('{"text": "a tyop"}\n')  # the same size, other bytes
    fixed = mirror("2")
    assert (fixed["copied"], fixed["already_there"]) == (1, 1), fixed
    assert fixed["verified_by"] == {"sha256": 1}
    assert (dst / "a.jsonl").read_bytes() == (src / "a.jsonl").read_bytes()
    (src / "b.jsonl").write_text('{"text": "FINE"}\n')
    forced = mirror("2", "--force", "mirror/web")
    assert (forced["copied"], forced["already_there"]) == (1, 1), forced
    assert (dst / "b.jsonl").read_bytes() == (src / "b.jsonl").read_bytes()
