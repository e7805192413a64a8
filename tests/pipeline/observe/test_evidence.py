"""A curation step's evidence as `drydock data` reads it: the reasons, the first documents of each,
text made safe for a terminal, and one clear error for a step that has none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.observe.evidence import evidence_line, one_line, read_data_sample
from pipeline.storage.opening import open_storage
from tests.pipeline.observe.dashboard.fixture_steps import (
    REMOVED,
    CorpusConfig,
    TrainConfig,
    train_tiny,
    write_corpus,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> tuple[str, str, dict[str, str]]:
    """(prefix, manifest, label by name) of a run of the fixture's curation step and a training."""
    prefix = str(tmp_path_factory.mktemp("evidence") / "prefix")
    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    train = Step("train/tiny", train_tiny, TrainConfig(output_of(corpus), this_output(), versioned(5)))
    report = run_experiment([train], ExecutorMainConfig(prefix=prefix, backend="local", experiment="curated"))
    assert report.ok
    (manifest,) = Path(prefix, "experiments").glob("curated-*.json")
    return prefix, str(manifest), {node.name: label for label, node in report.plan.dag.nodes.items()}


def test_the_sample_has_each_reason_largest_first_and_its_first_documents(curated):
    prefix, _manifest, labels = curated
    output = f"{prefix}/{labels['data/corpus']}"
    sample = read_data_sample(open_storage(prefix), output, per_reason=1, kept=2)
    assert list(sample.reasons) == ["too_short", "duplicate", "language"]
    assert sample.reasons["too_short"] == {
        "documents": 2,
        "bytes": sum(len(t[1]) for t in REMOVED if t[0] == "too_short"),
    }
    assert [d["index"] for d in sample.removed["too_short"]] == [3]  # the first of two
    assert sample.removed["duplicate"][0]["detail"]["duplicate_of"]["excerpt"] == "DOC 0"
    assert [d["id"] for d in sample.kept] == ["doc-0", "doc-1"] and sample.kept[0]["file"] == "docs.jsonl"
    assert sample.total == {"documents_in": 7, "documents_kept": 3}
    only = read_data_sample(open_storage(prefix), output, per_reason=5, reason="language")
    assert list(only.removed) == ["language"]
    assert read_data_sample(open_storage(prefix), f"{prefix}/{labels['train/tiny']}") is None


def test_text_for_a_terminal_is_one_escaped_line():
    assert one_line("a\nb\x1b[31mred\x07") == "a⏎b\\x1b[31mred\\x07"
    assert one_line("x" * 200, limit=10) == "x" * 9 + "…"
    assert one_line("naïve — “ok”") == "naïve — “ok”"
    line = evidence_line(
        4, {"id": "d4", "url": "http://a.test/x", "other": 1}, "é" * 700, "rule", 0.5, {"k": 1}
    )
    assert line == {
        "index": 4,
        "id": "d4",
        "url": "http://a.test/x",
        "reason": "rule",
        "score": 0.5,
        "detail": {"k": 1},
        "bytes": 1400,
        "excerpt": "é" * 600,
    }


def drydock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_drydock_data_prints_the_reasons_and_documents_and_says_clearly_what_it_cannot(curated):
    _prefix, manifest, labels = curated
    shown = drydock("data", manifest, "data/corpus", "--samples", "1")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"{labels['data/corpus']}: 3 of 7 documents kept" in out
    assert "removed: too_short (1 of 2)" in out and "<script>alert('x')</script> hi" in out
    assert "\x1b" not in out and "\\x1b[31mrot" in out  # a crawled escape sequence stays inert
    assert "duplicate of docs.jsonl #0:" in out and "DOC 0" in out
    assert "kept (1 of 3)" in out
    as_json = json.loads(
        drydock("data", manifest, labels["data/corpus"], "--json", "--reason", "language").stdout
    )
    assert list(as_json["removed"]) == ["language"] and as_json["step"] == labels["data/corpus"]
    for args, field in (
        (("data/corpus", "--reason", "nothing"), "--reason"),
        (("train/tiny",), "STEP"),
        (("no/such",), "STEP"),
        (("data/corpus", "--samples", "-1"), "--samples"),
    ):
        failed = drydock("data", manifest, *args)
        assert failed.returncode == 2 and failed.stdout == "", args
        assert len(failed.stderr.strip().splitlines()) == 1 and field in failed.stderr, failed.stderr


def test_drydock_data_never_follows_a_symbolic_link_out_of_the_prefix(curated, tmp_path):
    # A step's evidence is data anyone with write access to the prefix may have changed: a link
    # in `removed/` to a file elsewhere on this machine must not have `drydock data` print it.
    prefix, manifest, labels = curated
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"reason": "too_short", "text": "PRIVATE KEY MATERIAL", "doc": 0}) + "\n")
    removed = Path(prefix, labels["data/corpus"], "removed")
    link = removed / "0-aaa-link.jsonl"  # first in name order: read before the real shards
    link.symlink_to(secret)
    try:
        shown = drydock("data", manifest, "data/corpus", "--samples", "5", "--json")
        assert shown.returncode == 0, shown.stderr
        assert "PRIVATE KEY MATERIAL" not in shown.stdout
        assert json.loads(shown.stdout)["removed"]["too_short"]  # the real evidence is still shown
    finally:
        link.unlink()
