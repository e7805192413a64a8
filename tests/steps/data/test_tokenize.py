"""The tokenize step on real files: formats, the Levanter cache it writes, resume, bad input."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from steps.data.tokenize import TokenizeConfig, TokenizeError, tokenize
from tests.steps.conftest import make_docs, write_jsonl


def config(tmp_path: Path, tokenizer_dir: str, train, validation=(), **kw) -> TokenizeConfig:
    return TokenizeConfig(
        train=[str(p) for p in train],
        validation=[str(p) for p in validation],
        tokenizer=tokenizer_dir,
        output=str(tmp_path / "out"),
        **kw,
    )


def load_cache(cache_dir: str):
    import numpy as np
    from levanter.store.cache import TreeCache

    return TreeCache.load(cache_dir, {"input_ids": np.zeros((0,), dtype=np.int32)})


def test_jsonl_and_gzip_and_text_and_parquet(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = make_docs(30)
    a = write_jsonl(tmp_path / "in" / "a.jsonl", docs[:10])
    b = tmp_path / "in" / "b.jsonl.gz"
    with gzip.open(b, "wt") as f:
        for d in docs[10:20]:
            f.write(json.dumps({"text": d}) + "\n")
    c = tmp_path / "in" / "c.parquet"
    pq.write_table(pa.table({"text": docs[20:25], "n": list(range(5))}), c)
    d = tmp_path / "in" / "d.txt"
    d.write_text("\n".join(docs[25:30]) + "\n")
    cfg = config(tmp_path, tokenizer_dir, [a, b, c, d], validation=[a])
    tokenize(cfg)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    train = stats["splits"]["train"]
    assert train["documents"] == 10 + 10 + 5 + 1  # a text file is one document by default
    assert [f["documents"] for f in train["files"]] == [10, 10, 5, 1]
    assert train["bytes"] == sum(len(t.encode()) for t in docs[:25]) + len(d.read_text())
    cache = load_cache(str(tmp_path / "out" / "train"))
    assert len(cache) == 26
    assert cache.flat_field_length("input_ids") == train["tokens"]
    # Round trip: the first document decodes back to its text between bos and eos.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    first = [int(x) for x in cache[0]["input_ids"]]
    eos = tok.token_to_id("<|endoftext|>")
    assert first[0] == eos and first[-1] == eos  # bos and eos are one token here (GPT-2 style)
    assert tok.decode(first[1:-1]) == docs[0]
    assert stats["splits"]["validation"]["documents"] == 10


def test_text_line_mode_and_globs(tmp_path, tokenizer_dir):
    for i in range(3):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"p{i}.txt").write_text("one line\n\nanother line\n")
    cfg = config(tmp_path, tokenizer_dir, [tmp_path / "in" / "p*.txt"], text_mode="line")
    tokenize(cfg)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["splits"]["train"]["documents"] == 6
    assert "validation" not in stats["splits"]


def test_a_directory_input_takes_every_data_file(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "in" / "x" / "a.jsonl", make_docs(3))
    write_jsonl(tmp_path / "in" / "y.jsonl", make_docs(4))
    tokenize(config(tmp_path, tokenizer_dir, [tmp_path / "in"]))
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["splits"]["train"]["documents"] == 7


def test_relative_inputs_are_under_input_root(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "data" / "a.jsonl", make_docs(3))
    cfg = TokenizeConfig(
        train=["data/a.jsonl"],
        tokenizer=tokenizer_dir,
        output=str(tmp_path / "out"),
        input_root=str(tmp_path),
    )
    tokenize(cfg)
    assert (tmp_path / "out" / "train" / "shard_ledger.json").exists()


def test_resume_skips_complete_shards(tmp_path, tokenizer_dir):
    files = [write_jsonl(tmp_path / "in" / f"s{i}.jsonl", make_docs(20, seed=i)) for i in range(4)]
    cfg = config(tmp_path, tokenizer_dir, files)
    tokenize(cfg)
    train = tmp_path / "out" / "train"
    markers = {p.parent.name: p.stat().st_mtime_ns for p in train.glob("part-*/.drydock-shard.json")}
    assert len(markers) == 4
    # As after a crash: shard 2 lost its marker (half-written), the split ledger was never written.
    (train / "part-00002" / ".drydock-shard.json").unlink()
    (train / "shard_ledger.json").unlink()
    (tmp_path / "out" / "stats.json").unlink()
    tokenize(cfg)
    after = {p.parent.name: p.stat().st_mtime_ns for p in train.glob("part-*/.drydock-shard.json")}
    assert {k: after[k] == markers[k] for k in markers} == {
        "part-00000": True,
        "part-00001": True,
        "part-00002": False,
        "part-00003": True,
    }
    assert len(load_cache(str(train))) == 80


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"text": "ok"}', "{broken json"], r"a.jsonl line 2: malformed JSON"),
        (
            ['{"text": "ok"}', '{"body": "no text"}'],
            r"a.jsonl line 2: no text field 'text' \(found: \['body'\]\)",
        ),
    ],
)
def test_bad_lines_fail_naming_file_and_line_or_are_skipped_and_counted(
    tmp_path, tokenizer_dir, lines, message
):
    path = tmp_path / "in" / "a.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TokenizeError, match=message + r".*on_bad_line='skip'"):
        tokenize(config(tmp_path, tokenizer_dir, [path]))
    assert not (tmp_path / "out" / "stats.json").exists()
    tokenize(config(tmp_path, tokenizer_dir, [path], on_bad_line="skip"))
    train = json.loads((tmp_path / "out" / "stats.json").read_text())["splits"]["train"]
    assert (train["documents"], train["skipped"]) == (1, 1)


def test_bad_inputs_are_clear_errors(tmp_path, tokenizer_dir):
    good = write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(2))
    with pytest.raises(TokenizeError, match=r"train input '.*missing.jsonl' does not exist"):
        tokenize(config(tmp_path, tokenizer_dir, [tmp_path / "missing.jsonl"]))
    with pytest.raises(TokenizeError, match=r"validation input '.*nothing-\*.jsonl' matches no files"):
        tokenize(config(tmp_path, tokenizer_dir, [good], validation=[tmp_path / "nothing-*.jsonl"]))
    with pytest.raises(TokenizeError, match="unknown format"):
        (tmp_path / "in" / "a.csv").write_text("x\n")
        tokenize(config(tmp_path, tokenizer_dir, [tmp_path / "in" / "a.csv"]))
    broken = tmp_path / "broken-tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(TokenizeError, match=r"tokenizer '.*broken-tokenizer' is unreadable"):
        tokenize(config(tmp_path, str(broken), [good]))
    with pytest.raises(TokenizeError, match="could not be fetched from the Hugging Face hub"):
        tokenize(config(tmp_path, "no-such-org/no-such-tokenizer", [good]))
    empty = tmp_path / "in" / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TokenizeError, match="train inputs hold no documents"):
        tokenize(config(tmp_path, tokenizer_dir, [empty]))
    assert not (tmp_path / "out" / "stats.json").exists()


def test_parquet_without_the_text_column(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["x"]}), path)
    with pytest.raises(TokenizeError, match=r"no column 'text' \(columns: \['body'\]\)"):
        tokenize(config(tmp_path, tokenizer_dir, [path]))


def test_memory_filesystem_inputs(tmp_path, tokenizer_dir):
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("/tok-test/in/a.jsonl", "w") as f:
        for d in make_docs(5):
            f.write(json.dumps({"text": d}) + "\n")
    cfg = TokenizeConfig(
        train=["memory://tok-test/in/*.jsonl"], tokenizer=tokenizer_dir, output=str(tmp_path / "out")
    )
    tokenize(cfg)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["splits"]["train"]["files"][0]["path"] == "memory:///tok-test/in/a.jsonl"
    assert stats["splits"]["train"]["documents"] == 5
    # The cache itself is written with tensorstore: memory:// is refused up front, clearly.
    with pytest.raises(TokenizeError, match="supports local paths, gs:// and s3://"):
        tokenize(TokenizeConfig(train=cfg.train, tokenizer=tokenizer_dir, output="memory://tok-test/out"))


KILL_EXPERIMENT = """
from pipeline import executor_main
from steps.data.tokenize import tokenize_step

step = tokenize_step("tokenized/killme", train={files!r}, tokenizer={tokenizer!r})
if __name__ == "__main__":
    executor_main([step])
"""


def test_killed_mid_way_the_rerun_redoes_only_unfinished_shards(tmp_path, tokenizer_dir):
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[3]
    files = [write_jsonl(tmp_path / "in" / f"s{i}.jsonl", make_docs(50, seed=i)) for i in range(3)]
    blocker = tmp_path / "in" / "s3.jsonl"
    os.mkfifo(blocker)  # reading it blocks until someone writes: the run is stuck inside shard 3
    exp = tmp_path / "exp.py"
    exp.write_text(KILL_EXPERIMENT.format(files=[str(p) for p in [*files, blocker]], tokenizer=tokenizer_dir))
    prefix = tmp_path / "prefix"
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), "--backend", "local"]
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(prefix.glob("tokenized/killme-*/train/part-*/.drydock-shard.json"))) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, "the first three shards never finished"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    (step_dir,) = prefix.glob("tokenized/killme-*")
    assert not (step_dir / "stats.json").exists()
    before = {p.parent.name: p.stat().st_mtime_ns for p in step_dir.glob("train/part-*/.drydock-shard.json")}
    blocker.unlink()
    write_jsonl(blocker, make_docs(50, seed=3))
    result = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # What the step prints is in its attempt's log (the console shows only state changes).
    logs = "".join(p.read_text() for p in (step_dir / ".logs").glob("attempt-*.log"))
    assert "3 of 4 shards already complete; resuming" in logs
    after = {p.parent.name: p.stat().st_mtime_ns for p in step_dir.glob("train/part-*/.drydock-shard.json")}
    assert {k: after[k] for k in before} == before  # finished shards were not redone
    assert set(after) == {"part-00000", "part-00001", "part-00002", "part-00003"}
    assert json.loads((step_dir / "stats.json").read_text())["splits"]["train"]["documents"] == 200


def test_shards_in_parallel_processes_give_the_same_cache(tmp_path, tokenizer_dir):
    files = [write_jsonl(tmp_path / "in" / f"s{i}.jsonl", make_docs(30, seed=i)) for i in range(3)]
    serial = TokenizeConfig(
        train=[str(f) for f in files], tokenizer=tokenizer_dir, output=str(tmp_path / "a")
    )
    parallel = TokenizeConfig(
        train=[str(f) for f in files], tokenizer=tokenizer_dir, output=str(tmp_path / "b"), num_workers=2
    )
    tokenize(serial)
    tokenize(parallel)
    a, b = load_cache(str(tmp_path / "a" / "train")), load_cache(str(tmp_path / "b" / "train"))
    assert len(a) == len(b) == 90
    assert all(list(a[i]["input_ids"]) == list(b[i]["input_ids"]) for i in range(90))


def test_the_rate_after_a_resume_counts_only_this_attempts_tokens(monkeypatch):
    """Shards done by an earlier attempt count in the totals, not in tokens per second."""
    import steps.data.tokenize as tokenize_module

    clock = iter([100.0, 101.0])
    monkeypatch.setattr(tokenize_module.time, "time", lambda: next(clock))
    bar = tokenize_module._Progress("train", documents=900, tokens=90_000)  # resumed: 9 shards done
    bar.advance(100, 1_000)  # one second later, this attempt's first shard
    (task,) = bar._progress.tasks
    assert task.fields["rate"] == "1,000 tok/s" and task.fields["documents"] == 1_000


REMAP_EXPERIMENT = """
from pipeline import executor_main
from steps.data.tokenize import tokenize_step

step = tokenize_step(
    "tokenized/moved",
    train=["data/corpus/train-*.jsonl"],
    validation=["data/corpus/validation.jsonl"],
    tokenizer="data/tokenizer",
    input_root={root!r},
)

if __name__ == "__main__":
    executor_main([step])
"""


def test_a_manifest_whose_checkout_moved_is_refused_then_remapped(tmp_path, tokenizer_dir):
    """A colleague's manifest records Alice's absolute input root. Planned where it is missing, it
    fails as the experiment file would (naming the step and field), not a plan of every step RUN;
    `--remap OLD=NEW` reads it where it is here, with the same identities."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    alice = tmp_path / "alice" / "checkout"
    write_jsonl(alice / "data" / "corpus" / "train-0.jsonl", make_docs(20))
    write_jsonl(alice / "data" / "corpus" / "validation.jsonl", make_docs(5, seed=1))
    shutil.copytree(tokenizer_dir, alice / "data" / "tokenizer")
    exp = tmp_path / "moved.py"
    exp.write_text(REMAP_EXPERIMENT.format(root=str(alice)))
    env = {**os.environ, "PYTHONPATH": str(root)}

    def drydock(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pipeline", *args, "--backend", "local"]
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=120)

    ran = drydock("run", str(exp), "--prefix", str(tmp_path / "alice-runs"), "--json")
    assert ran.returncode == 0, ran.stderr[-2000:]
    (label,) = [s["label"] for s in json.loads(ran.stdout)["steps"]]
    (manifest,) = (tmp_path / "alice-runs" / "experiments").glob("moved-*.json")
    bob = tmp_path / "bob" / "src"
    shutil.move(str(alice), str(bob))  # Bob's checkout is elsewhere

    planned = drydock("plan", str(manifest), "--prefix", str(tmp_path / "bob-runs"))
    assert planned.returncode == 2, planned.stdout
    *_code, error = planned.stderr.strip().splitlines()  # after the code the recipe runs
    field = "error: step 'tokenized/moved', field `train[0]`"
    assert error == f"{field}: input 'data/corpus/train-*.jsonl' matches no files under {alice}"

    remap = ["--remap", f"{alice}={bob}"]
    replanned = drydock("plan", str(manifest), "--prefix", str(tmp_path / "bob-runs"), *remap, "--json")
    assert replanned.returncode == 0, replanned.stderr
    assert [(s["label"], s["state"]) for s in json.loads(replanned.stdout)["steps"]] == [(label, "RUN")]
    rerun = drydock("rerun", str(manifest), "--prefix", str(tmp_path / "bob-runs"), *remap, "--json")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert [s["label"] for s in json.loads(rerun.stdout)["steps"]] == [label]

    typo = drydock("plan", str(manifest), "--remap", "/nowhere=/x")
    assert (
        typo.returncode == 2
        and "field `--remap`: no path the recipe records is under '/nowhere'" in typo.stderr
    )
    malformed = drydock("plan", str(manifest), "--remap", "/nowhere")
    assert malformed.returncode == 2 and "'/nowhere' is not OLD=NEW" in malformed.stderr


def test_writes_gathered_across_batches_keep_every_document_whole(tmp_path, tokenizer_dir, monkeypatch):
    """Encoded batches reach the store in large writes (`cache.WRITE_TOKENS`): documents split
    across encode batches and writes of every size read back exactly as one write per file."""
    from tokenizers import Tokenizer

    from steps.data.tokenize import cache as cache_module

    docs = make_docs(60, seed=3)
    source = write_jsonl(tmp_path / "in" / "a.jsonl", docs)
    tokenize(config(tmp_path / "one", tokenizer_dir, [source]))
    monkeypatch.setattr(cache_module, "WRITE_TOKENS", 50)  # a write every few documents
    tokenize(config(tmp_path / "many", tokenizer_dir, [source], batch_size=7))
    one = load_cache(str(tmp_path / "one" / "out" / "train"))
    many = load_cache(str(tmp_path / "many" / "out" / "train"))
    assert len(one) == len(many) == 60
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    for i, text in enumerate(docs):
        ids = [int(x) for x in many[i]["input_ids"]]
        assert ids == [int(x) for x in one[i]["input_ids"]]
        assert tok.decode(ids[1:-1]) == text
