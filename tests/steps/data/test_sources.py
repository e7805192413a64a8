"""Raw inputs whose identity does not depend on where they are, and listings that catch changes.

Local inputs and a local tokenizer in two checkouts, raw datasets in two S3 buckets (two moto
buckets standing for two regions), a file appended to under a cached step, and bad input.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from pipeline.core.plan import Plan, State
from steps.data.sources import input_identity, list_inputs, raw_dataset, tokenizer_identity
from steps.data.tokenize import tokenize_step
from tests.s3server import s3_bucket_environment
from tests.steps.conftest import make_docs, write_jsonl


def checkout(root: Path, tokenizer_dir: str) -> Path:
    """A small "checkout": a corpus and a copy of the tokenizer under `root`."""
    write_jsonl(root / "data" / "train-0.jsonl", make_docs(40))
    write_jsonl(root / "data" / "train-1.jsonl", make_docs(40, seed=5))
    write_jsonl(root / "data" / "validation-0.jsonl", make_docs(10, seed=9))
    shutil.copytree(tokenizer_dir, root / "tok")
    return root


def step(root: Path, **kw):
    args = {
        "train": ["data/train-*.jsonl"],
        "validation": ["data/validation-0.jsonl"],
        "tokenizer": "tok",
        "input_root": str(root),
    }
    return tokenize_step("tokenized/x", **{**args, **kw})


def plan_of(steps, prefix: Path) -> Plan:
    plan = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert isinstance(plan, Plan)
    return plan


def run(steps, prefix: Path) -> None:
    report = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), backend="local"))
    assert report.ok


def only(plan: Plan):
    (entry,) = plan.steps.values()
    return entry


# -- identity ------------------------------------------------------------------------------------


def test_identity_forms_leave_the_location_out(tmp_path, tokenizer_dir):
    assert input_identity("data/a/*.jsonl", "/anywhere") == "data/a/*.jsonl"
    assert input_identity("/home/a/study/../data/x.jsonl", None) == "/home/a/data/x.jsonl"
    assert input_identity("/home/a/study/data/x.jsonl", "/home/a/study/") == "data/x.jsonl"
    assert input_identity("gs://us-bucket/raw/web/*.zst", None) == "raw/web/*.zst"
    assert input_identity("s3://eu-bucket/raw/web/*.zst", None) == "raw/web/*.zst"
    web = raw_dataset("web", version="2026-11", urls=["gs://us/raw/web", "gs://eu/raw/web"])
    assert input_identity(web, None) == {"dataset": "web", "version": "2026-11"}
    # A local tokenizer by its files: a copy elsewhere is the same tokenizer; an edit is not.
    copy = tmp_path / "elsewhere" / "tok"
    shutil.copytree(tokenizer_dir, copy)
    assert tokenizer_identity(str(copy), None) == tokenizer_identity(tokenizer_dir, None)
    assert tokenizer_identity("tok", str(copy.parent)) == tokenizer_identity(tokenizer_dir, None)
    (copy / "tokenizer_config.json").write_text("{}")
    assert tokenizer_identity(str(copy), None) != tokenizer_identity(tokenizer_dir, None)
    assert tokenizer_identity("org/name", None) == "org/name"


def test_a_checkout_elsewhere_is_fully_cached(tmp_path, tokenizer_dir):
    prefix = tmp_path / "prefix"
    a = checkout(tmp_path / "a" / "study", tokenizer_dir)
    b = checkout(tmp_path / "b", tokenizer_dir)
    run([step(a)], prefix)
    # Another checkout, another place; an absolute tokenizer path spelled with '..'.
    plan = plan_of([step(b, tokenizer=str(b / "data" / ".." / "tok"))], prefix)
    entry = only(plan)
    assert entry.state == State.CACHED
    # Unversioned locations moved (noted), but no input file changed.
    assert not [n for n in entry.notes if n.startswith("input listing")]


# -- listings -------------------------------------------------------------------------------------


def test_appending_to_a_local_input_gives_a_note_and_never_silently(tmp_path, tokenizer_dir):
    prefix = tmp_path / "prefix"
    root = checkout(tmp_path / "c", tokenizer_dir)
    run([step(root)], prefix)
    assert only(plan_of([step(root)], prefix)).reason == "cached"

    with open(root / "data" / "train-1.jsonl", "a") as f:
        for doc in make_docs(50, seed=11):
            f.write(f'{{"text": "{doc}"}}\n')
    write_jsonl(root / "data" / "train-2.jsonl", make_docs(5))
    entry = only(plan_of([step(root)], prefix))
    assert entry.state == State.CACHED  # identity decides; the note says the data moved on
    assert entry.reason == "cached; input listing changed: 1 file added, 1 modified"
    assert "added train:data/train-2.jsonl" in entry.notes
    assert "modified train:data/train-1.jsonl" in entry.notes

    # --force retokenizes and records the new listing: the note goes.
    report = run_experiment([step(root)], ExecutorMainConfig(prefix=str(prefix), backend="local", force="."))
    assert report.ok
    assert only(plan_of([step(root)], prefix)).reason == "cached"

    (root / "data" / "train-0.jsonl").unlink()
    entry = only(plan_of([step(root)], prefix))
    assert entry.reason == "cached; input listing changed: 1 file removed"


def test_a_listing_that_cannot_be_read_fails_the_step_and_is_a_note_when_cached(tmp_path, tokenizer_dir):
    prefix = tmp_path / "prefix"
    root = checkout(tmp_path / "c", tokenizer_dir)
    bad = tokenize_step("tokenized/bad", train=["nosuch://bucket/raw/*.jsonl"], tokenizer=str(root / "tok"))
    report = run_experiment([bad], ExecutorMainConfig(prefix=str(prefix), backend="local"))
    assert not report.ok
    (outcome,) = report.outcomes.values()
    assert outcome.error is not None
    assert "train input 'nosuch://bucket/raw/*.jsonl' cannot be listed: ValueError" in outcome.error
    assert not list(prefix.glob("tokenized/bad-*/stats.json"))  # nothing committed

    declared = step(root)
    run([declared], prefix)
    shutil.rmtree(root / "data")  # gone after the recipe was declared (or on another machine)
    entry = only(plan_of([declared], prefix))
    assert entry.state == State.CACHED
    assert entry.reason == (
        "cached; input listing cannot be read now: train input 'data/train-*.jsonl' matches no files"
    )


def test_a_content_addressed_dataset_reruns_when_its_files_change(tmp_path, tokenizer_dir):
    prefix = tmp_path / "prefix"
    root = checkout(tmp_path / "c", tokenizer_dir)

    def declared():
        data = raw_dataset(
            "demo", version="1", urls=[str(root / "data" / "train-*.jsonl")], content_addressed=True
        )
        return step(root, train=[data])

    run([declared()], prefix)
    assert only(plan_of([declared()], prefix)).state == State.CACHED
    write_jsonl(root / "data" / "train-0.jsonl", make_docs(41))
    assert only(plan_of([declared()], prefix)).state == State.RUN


def test_listing_keys_do_not_depend_on_the_location(tmp_path):
    for where in ("a", "b/c"):
        write_jsonl(tmp_path / where / "raw" / "part-0.jsonl", make_docs(3))
    a = list_inputs({"train": [str(tmp_path / "a" / "raw" / "*.jsonl")]}, None)
    b = list_inputs({"train": ["raw/*.jsonl"]}, str(tmp_path / "b" / "c"))
    assert list(a) == [f"train:{tmp_path}/a/raw/part-0.jsonl"]  # absolute: outside any input_root
    assert list(b) == ["train:raw/part-0.jsonl"]
    d1 = raw_dataset("d", version="1", urls=[str(tmp_path / "a" / "raw")])
    d2 = raw_dataset("d", version="1", urls=[str(tmp_path / "b" / "c" / "raw")])
    assert list_inputs({"train": [d1]}, None) == list_inputs({"train": [d2]}, None)


# -- two buckets for two regions ------------------------------------------------------------------

BUCKETS = ("drydock-us", "drydock-eu")


@pytest.fixture(scope="module")
def s3() -> Iterator[None]:
    import fsspec

    with s3_bucket_environment(BUCKETS[0]):
        fsspec.filesystem("s3").mkdir(BUCKETS[1])
        yield


def test_the_same_dataset_in_another_bucket_keeps_every_identity(s3, tmp_path, tokenizer_dir):
    import fsspec

    fs = fsspec.filesystem("s3")
    run_dir = f"raw-{uuid.uuid4().hex[:8]}/web"
    local = write_jsonl(tmp_path / "part-0.jsonl", make_docs(30))
    for bucket in BUCKETS:
        fs.put_file(str(local), f"{bucket}/{run_dir}/part-0.jsonl")
    us, eu = (f"s3://{bucket}/{run_dir}" for bucket in BUCKETS)

    def declared(*urls: str):
        web = raw_dataset("web", version="2026-11", urls=list(urls))
        return tokenize_step("tokenized/web", train=[web], tokenizer=tokenizer_dir)

    prefix = tmp_path / "prefix"
    run([declared(us, eu)], prefix)
    # The US bucket is gone (a failover): the same recipe reading from the EU copy is cached.
    entry = only(plan_of([declared(eu)], prefix))
    assert entry.state == State.CACHED
    assert not [n for n in entry.notes if n.startswith("input listing")]
    assert any(n.startswith("unversioned field `train.0.urls") for n in entry.notes)
    # Plain URLs lose their bucket in identity too.
    plain = [
        tokenize_step("tokenized/plain", train=[f"{u}/*.jsonl"], tokenizer=tokenizer_dir) for u in (us, eu)
    ]
    assert plain[0].config.input_identity == plain[1].config.input_identity

    fs.pipe_file(f"{BUCKETS[1]}/{run_dir}/part-1.jsonl", b'{"text": "one more"}\n')
    entry = only(plan_of([declared(eu)], prefix))
    assert entry.reason == "cached; input listing changed: 1 file added"


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"urls": []}, "urls", "declares no URLs"),
        ({"urls": "gs://b/x"}, "urls", "declares no URLs"),
        ({"urls": ["gs://b/x"], "version": ""}, "version", "declare a version"),
    ],
)
def test_a_bad_dataset_declaration_is_one_clear_error(kwargs, field, message):
    with pytest.raises(StepDeclarationError, match=message) as info:
        raw_dataset("web", **{"version": "1", **kwargs})
    assert info.value.field == field
    assert "raw dataset 'web'" in str(info.value)


def test_local_hashes_are_cached_by_size_and_modification_time(tmp_path, monkeypatch):
    import steps.data.sources as sources

    monkeypatch.setenv("DRYDOCK_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(tmp_path / "raw" / "part-0.jsonl", make_docs(20))
    hashed: list[str] = []
    real = sources._sha256_file
    monkeypatch.setattr(sources, "_sha256_file", lambda p: hashed.append(p) or real(p))

    def listing() -> dict:
        monkeypatch.setattr(sources, "_HASHES", sources._HashCache())  # as a new process would
        return list_inputs({"train": [str(data)]}, None)

    first = listing()
    assert hashed == [str(data)] and (tmp_path / "cache" / "file-hashes.json").exists()
    assert listing() == first and hashed == [str(data)]  # the second plan reads no content
    with open(data, "a") as f:
        f.write('{"text": "one more"}\n')
    changed = listing()
    assert len(hashed) == 2 and changed != first


def test_a_file_replaced_with_the_same_size_and_a_restored_mtime_is_hashed_again(tmp_path, monkeypatch):
    # `tar x`, `cp -p` and `rsync -a` restore the modification time, and ext4 often gives a file
    # made anew the inode of the one just deleted: same device, inode, size and mtime. Rewriting
    # the file in place (its inode kept for certain) and restoring its mtime makes that case on
    # any file system. The cache must still see new bytes (issue 29, part 4).
    import steps.data.sources as sources

    monkeypatch.setenv("DRYDOCK_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "raw" / "part-0.jsonl"
    data.parent.mkdir()
    data.write_text('{"text": "old bytes"}\n')

    def listing() -> dict:
        monkeypatch.setattr(sources, "_HASHES", sources._HashCache())  # as a new process would
        return list_inputs({"train": [str(data)]}, None)

    first = listing()
    old = os.stat(data)
    time.sleep(0.01)  # a later ctime, on file systems with coarse timestamps too
    with open(data, "r+b") as f:
        f.write(b'{"text": "new bytes"}\n')
    os.utime(data, ns=(old.st_atime_ns, old.st_mtime_ns))
    new = os.stat(data)
    assert (new.st_dev, new.st_ino, new.st_size, new.st_mtime_ns) == (
        old.st_dev,
        old.st_ino,
        old.st_size,
        old.st_mtime_ns,
    )
    second = listing()
    assert next(iter(second.values()))["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert second != first
