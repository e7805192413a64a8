"""The web curation recipe end to end, as a user runs it (`python experiments/web_to_tokens.py`,
on the default Ray backend): each stage removes the kind of page it is for, with its evidence, and
a rerun does nothing. The demo crawl's URLs name the kind of each page (scripts/make_web_crawl.py),
so the evidence can be checked against what each page was made to be."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from steps.data.filtering import read_evidence

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(prefix: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "experiments/web_to_tokens.py", "--prefix", str(prefix)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def kinds(step_dir: Path) -> Counter:
    """(reason, kind of page) of every removal the step's evidence records."""
    return Counter((e["reason"], e["url"].split("/")[3]) for e in read_evidence(str(step_dir)))


def test_web_to_tokens_removes_each_kind_of_page_at_its_stage_and_a_rerun_does_nothing(tmp_path):
    prefix = tmp_path / "runs"
    first = run(prefix)
    assert first.returncode == 0, first.stderr[-4000:]
    (extract,) = prefix.glob("extract/web-*")
    removed = kinds(extract)
    assert {reason for reason, _kind in removed} == {"empty", "not_html", "truncated"}
    assert removed[("truncated", "article")] == 1  # the cut last record of crawl-0002
    assert {kind for _reason, kind in removed} <= {"odd", "list", "article"}
    stats = json.loads((extract / "stats.json").read_text())["total"]
    assert stats["documents_in"] == 450 and stats["documents_kept"] == stats["documents_in"] - sum(
        removed.values()
    )

    (language,) = prefix.glob("language/web-*")
    assert set(kinds(language)) == {("language", "foreign")}
    kept = [
        json.loads(line)
        for shard in sorted((language / "data").rglob("*.jsonl.gz"))
        for line in gzip.decompress(shard.read_bytes()).splitlines()
    ]
    assert not any("/foreign/" in d["url"] for d in kept)  # every foreign page removed

    (heuristics,) = prefix.glob("heuristics/web-*")
    by_kind = Counter(kind for _reason, kind in kinds(heuristics).elements())
    assert by_kind["spam"] > 0 and by_kind["boilerplate"] > 0 and by_kind["foreign"] == 0
    (quality,) = prefix.glob("quality/web-*")
    assert {kind for _reason, kind in kinds(quality)} == {"seo"}  # what the rules could not see
    (classifier,) = prefix.glob("quality/classifier-*")
    assert json.loads((classifier / "metrics.json").read_text())["validation"]["accuracy"] >= 0.95
    (dedupe,) = prefix.glob("dedupe/web-*")
    assert (
        json.loads((dedupe / "stats.json").read_text())["total"]["documents_in"]
        > json.loads((dedupe / "stats.json").read_text())["total"]["documents_out"]
    )
    # Dedupe's evidence names the kept twin of each copy; what it removed are the crawl's copies.
    (good_data,) = quality.glob("data")
    removed = list(read_evidence(str(dedupe)))
    assert removed and {e["reason"] for e in removed} <= {"exact_duplicate", "near_duplicate"}
    for e in removed:
        lines = gzip.decompress((good_data / e["file"]).read_bytes()).splitlines()
        assert json.loads(lines[e["index"]])["url"].split("/")[3] == "copy"
        assert "excerpt" in e["detail"]["duplicate_of"]
    (decontaminated,) = prefix.glob("decontaminate/web-*")
    assert {e["reason"] for e in read_evidence(str(decontaminated))} == {"contamination"}
    (mixture,) = prefix.glob("mixture/web-*")
    assert (mixture / "data_config.yaml").exists()
    assert "held-out accuracy" in first.stdout and "documents from 450 pages" in first.stdout

    (manifest,) = (prefix / "experiments").glob("web_to_tokens-*.json")
    shown = subprocess.run(
        [sys.executable, "-m", "pipeline", "data", str(manifest), "dedupe/web", "--samples", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and "duplicate of data/web/crawl-" in shown.stdout, (
        shown.stdout + shown.stderr
    )

    second = run(prefix)
    assert second.returncode == 0, second.stderr[-4000:]
    console = second.stdout + second.stderr
    assert console.count("CACHED") == 10 and "SUCCEEDED" not in console, console
