"""The dedupe step on real shards: planted exact and near duplicates, formats, resume, bad input."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from steps.data.dedupe import DedupeConfig, DedupeError, dedupe, dedupe_step, normalize, removed_indices
from steps.data.filtering import read_evidence

ROOT = Path(__file__).resolve().parents[3]


def vocabulary(rng: random.Random, n: int = 3000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def unique_docs(n: int, seed: int) -> list[str]:
    """Documents of random words: no two are near each other."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(150, 250))) + "." for _ in range(n)]


def near_copy(doc: str, rng: random.Random) -> str:
    """An edited copy: one word replaced (a Jaccard similarity of 5-grams of about 0.94, well
    above the 0.8 threshold; near the threshold, LSH finds a pair with a probability below 1)."""
    words = doc.split(" ")
    words[rng.randrange(len(words))] = "edited"
    return " ".join(words)


def write_jsonl(path: Path, texts: list[str], opener=open) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"{path.name}/{i}", "text": text}) + "\n")


def planted_corpus(root: Path) -> tuple[set[tuple[str, int]], int]:
    """Three shards (jsonl, jsonl.gz, parquet) of unique documents plus planted duplicates;
    returns the planted (file, index) pairs and the number of unique documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(7)
    docs = unique_docs(240, seed=1)
    shards: list[list[str]] = [docs[0:80], docs[80:160], docs[160:240]]
    planted = []
    # Copies of documents of the first shard, which comes first: the original is the one kept.
    for _ in range(12):  # exact copies, respelled: case and whitespace do not matter
        original = docs[rng.randrange(80)]
        planted.append(("exact", "  " + original.upper().replace(" ", "\n  ", 3)))
    for _ in range(12):  # near copies: edited
        planted.append(("near", near_copy(docs[rng.randrange(80)], rng)))
    names = ["a.jsonl", "b.jsonl.gz", "c.parquet"]
    where: set[tuple[str, int]] = set()
    for k, (_kind, text) in enumerate(planted):
        shard = k % 3
        position = len(shards[shard])
        shards[shard].append(text)
        where.add((f"raw/{names[shard]}", position))
    write_jsonl(root / "raw" / "a.jsonl", shards[0])
    write_jsonl(root / "raw" / "b.jsonl.gz", shards[1], opener=gzip.open)
    table = pa.table({"text": shards[2], "id": list(range(len(shards[2])))})
    pq.write_table(table, root / "raw" / "c.parquet")
    return where, 240


def run_step(step, prefix: Path):
    report = run_experiment([step], ExecutorMainConfig(prefix=str(prefix), backend="local"))
    assert report.ok, report
    (out,) = (prefix / step.name.split("/")[0]).glob(f"{step.name.split('/')[1]}-*")
    return out


# The defaults, the passes as first written (old recipes), and the one mix of them.
PASSES = [("one_permutation", "components"), ("datasketch", "first_match"), ("datasketch", "components")]


@pytest.mark.parametrize(("minhash", "grouping"), PASSES)
def test_the_planted_duplicates_and_only_they_are_removed(tmp_path, minhash, grouping):
    planted, unique = planted_corpus(tmp_path)
    step = dedupe_step(
        "dedupe/planted",
        inputs=["raw"],
        input_root=str(tmp_path),
        sample_pairs=5,
        minhash=minhash,
        grouping=grouping,
    )
    out = run_step(step, tmp_path / "prefix")
    evidence = list(read_evidence(str(out)))  # what the step says it removed, and why
    removed = {(e["file"], e["index"]) for e in evidence}
    assert len(removed) == len(evidence)
    # ... which is what its kept shards lack.
    assert removed == {
        (f"raw/{name}", i)
        for name in ("a.jsonl", "b.jsonl.gz", "c.parquet")
        for i in removed_indices(str(tmp_path / "raw" / name), str(out / "data" / "raw" / name))
    }
    true_positives = len(removed & planted)
    precision, recall = true_positives / len(removed), true_positives / len(planted)
    print(f"planted {len(planted)}, removed {len(removed)}: precision {precision:.3f}, recall {recall:.3f}")
    assert removed == planted  # precision and recall 1.0 on the planted duplicates
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total"]["documents_in"] == unique + len(planted)
    assert stats["total"]["documents_out"] == unique
    assert stats["total"]["exact_removed"] == 12 and stats["total"]["near_removed"] == 12
    assert 0 < stats["total"]["clusters"] <= 24
    assert (stats["parameters"]["minhash"], stats["parameters"]["grouping"]) == (minhash, grouping)
    assert stats["total"]["bytes_out"] < stats["total"]["bytes_in"]
    assert {r: v["documents"] for r, v in stats["total"]["reasons"].items()} == {
        "exact_duplicate": 12,
        "near_duplicate": 12,
    }
    # Each removal names the document kept for it (kept indeed); the first of each shard show it.
    for e in evidence:
        twin = e["detail"]["duplicate_of"]
        assert (twin["file"], twin["index"]) not in removed
        if "excerpt" in twin and e["reason"] == "exact_duplicate":
            assert e["score"] == 1.0 and normalize(e["excerpt"])[:300] == normalize(twin["excerpt"])[:300]
        elif "excerpt" in twin:
            assert 0.8 <= e["score"] < 1  # the estimated similarity, at least the threshold
    assert sum("excerpt" in e["detail"]["duplicate_of"] for e in evidence) == len(evidence)  # < 20 a shard
    pairs = [json.loads(line) for line in (out / "removed_pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 5
    for pair in pairs:
        if pair["kind"] == "exact":
            # (texts are cut at 1,000 characters)
            assert normalize(pair["removed"]["text"])[:500] == normalize(pair["kept"]["text"])[:500]
        else:
            assert 0.8 <= pair["similarity"] < 1
    # jsonl lines are kept byte for byte, in the input's compression.
    original_lines = (tmp_path / "raw" / "a.jsonl").read_text().splitlines()
    kept_lines = (out / "data" / "raw" / "a.jsonl").read_text().splitlines()
    assert set(kept_lines) <= set(original_lines)
    with gzip.open(out / "data" / "raw" / "b.jsonl.gz", "rt") as f:
        assert all(json.loads(line)["id"].startswith("b.jsonl.gz/") for line in f)


@pytest.mark.parametrize(("minhash", "grouping"), PASSES)
def test_the_demo_corpus_loses_only_what_was_planted(tmp_path, minhash, grouping):
    """The committed corpus with ten copies planted: the copies go, and of the corpus itself at
    most its one known near duplicate (two prose stories that differ in one animal)."""
    corpus = ROOT / "data" / "corpus" / "prose" / "train-0000.jsonl"
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    write_jsonl(tmp_path / "extra" / "planted.jsonl", texts[:10])
    step = dedupe_step(
        "dedupe/demo",
        inputs=[str(ROOT / "data" / "corpus" / d / "train-*.jsonl") for d in ("prose", "arithmetic")]
        + [str(tmp_path / "extra" / "planted.jsonl")],
        minhash=minhash,
        grouping=grouping,
    )
    stats = json.loads((run_step(step, tmp_path / "prefix") / "stats.json").read_text())
    assert stats["sources"][str(tmp_path / "extra" / "planted.jsonl")]["documents_out"] == 0
    corpus_removed = sum(
        s["documents_in"] - s["documents_out"]
        for name, s in stats["sources"].items()
        if name.startswith(str(ROOT))
    )
    assert corpus_removed <= 1, stats["sources"]


def test_a_rerun_after_a_failure_reuses_the_finished_shards(tmp_path):
    docs = unique_docs(30, seed=3)
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"s{i}.jsonl", docs[i * 10 : (i + 1) * 10])
    (tmp_path / "in" / "s3.jsonl").write_text('{"text": "fine"}\nnot json\n')
    config = DedupeConfig(inputs=[str(tmp_path / "in")], output=str(tmp_path / "out"))
    with pytest.raises(DedupeError, match=r"s3.jsonl line 2: malformed JSON"):
        dedupe(config)
    work = sorted((tmp_path / "out" / ".work").rglob("*.npz"))
    assert len(work) == 3
    before = {p: p.stat().st_mtime_ns for p in work}
    (tmp_path / "in" / "s3.jsonl").write_text('{"text": "fine"}\n')
    dedupe(config)
    assert {p: p.stat().st_mtime_ns for p in work} == before  # not recomputed
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["total"]["documents_out"] == 31


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"threshold": 0}, "threshold", r"threshold must be in \(0, 1\], got 0"),
        ({"threshold": 1.5}, "threshold", r"threshold must be in \(0, 1\], got 1.5"),
        ({"ngram": 0}, "ngram", "ngram must be a positive integer"),
        ({"num_perm": 1}, "num_perm", "num_perm must be at least 2"),
        ({"inputs": []}, "inputs", "no inputs given"),
        ({"minhash": "rensa"}, "minhash", "minhash must be one of one_permutation, datasketch, got 'rensa'"),
        ({"grouping": "greedy"}, "grouping", "grouping must be one of components, first_match, got 'greedy'"),
        ({"band_parts": 0}, "band_parts", "band_parts must be a positive integer, got 0"),
    ],
)
def test_bad_parameters_are_one_clear_error(kwargs, field, message):
    with pytest.raises(StepDeclarationError, match=message) as info:
        dedupe_step("dedupe/bad", **{"inputs": ["x.jsonl"], **kwargs})
    assert info.value.field == field and "step 'dedupe/bad'" in str(info.value)


def test_how_signatures_are_computed_is_versioned_and_old_recipes_keep_their_identity(tmp_path):
    """`minhash` and `grouping` entered the config after dedupe steps were made: datasketch and
    first_match (how they were made) leave their identity as it was, and a recorded config
    without the fields rebuilds as those; the defaults now are another identity. `band_parts`
    changes nothing removed, so it is not versioned."""
    from pipeline.core.dag import build_dag

    write_jsonl(tmp_path / "raw" / "a.jsonl", ["one two three"])

    def payload(**kwargs):
        step = dedupe_step("dedupe/x", inputs=["raw/a.jsonl"], input_root=str(tmp_path), **kwargs)
        (node,) = build_dag([step], str(tmp_path / "prefix")).nodes.values()
        return node.identity.payload, node.label

    old, old_label = payload(minhash="datasketch", grouping="first_match")
    new, new_label = payload()
    assert {"minhash", "grouping"}.isdisjoint(old["versioned"]) and new_label != old_label
    assert (new["versioned"].pop("minhash"), new["versioned"].pop("grouping")) == (
        "one_permutation",
        "components",
    )
    assert new == old
    assert payload(band_parts=8)[1] == new_label
    config = DedupeConfig(inputs=[], output="x")
    assert (config.minhash, config.grouping, config.band_parts) == ("datasketch", "first_match", 1)


def test_the_plan_says_what_each_task_holds_for_the_corpus_given():
    from steps.data.dedupe import preview

    config = DedupeConfig(inputs=[], output="x", grouping="components", band_parts=8, documents=10**8)
    shown = preview(config)
    assert "9 bands of 13 values (threshold 0.8) and the exact pass, 8 part(s) each: 80 tasks" in shown
    # 16 bytes a document of the part: 1e8 / 8 x 16 bytes = 190.7 MiB
    assert "memory for 100,000,000 documents: a band part 190.7 MiB and 512 bytes per candidate" in shown
    assert "documents=N" in preview(DedupeConfig(inputs=[], output="x"))


def test_removed_indices_reads_which_records_a_kept_shard_lacks(tmp_path):
    docs = [f"document number {i} with some words" for i in range(6)]
    source, kept, stranger = tmp_path / "in.jsonl", tmp_path / "kept.jsonl", tmp_path / "other.jsonl"
    write_jsonl(source, docs)
    write_jsonl(kept, [docs[0], docs[2], docs[5]])
    write_jsonl(stranger, [docs[2], "not an input record"])
    assert removed_indices(str(source), str(kept)) == [1, 3, 4]
    assert removed_indices(str(source), str(source)) == []
    with pytest.raises(DedupeError, match="not those of"):
        removed_indices(str(source), str(stranger))


def test_the_records_read_are_the_records_written(tmp_path):
    """Regression (data loss): reading numbered records as text mode does (a lone carriage return
    ended a line) while writing split at newlines only kept both copies of a duplicate and dropped
    a unique document. One definition of a record: valid JSON Lines keeps the right documents,
    and a line that is not one record is an error naming it, with nothing written."""
    shard = tmp_path / "in" / "s.jsonl"
    shard.parent.mkdir()
    shard.write_bytes(
        b'{"text": "A", "n": 1}\r\n'
        b'{"text": "A",\r"n": 2}\n'  # a carriage return is JSON whitespace inside a record
        b" \t\r\n"
        b'{"text": "B"}\n'
        b'{"text": "C"}'
    )
    config = DedupeConfig(inputs=[str(shard.parent)], output=str(tmp_path / "out"), near=False)
    dedupe(config)
    (out,) = (tmp_path / "out" / "data").rglob("*.jsonl")
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"text": "A", "n": 1},
        {"text": "B"},
        {"text": "C"},
    ]

    shard.write_bytes(b'{"text": "A"}\r{"text": "A"}\n{"text": "B"}\n{"text": "C"}\n')
    bad = DedupeConfig(inputs=[str(shard.parent)], output=str(tmp_path / "bad"), near=False)
    with pytest.raises(DedupeError, match=r"s.jsonl line 1: malformed JSON .*carriage return"):
        dedupe(bad)
    assert not (tmp_path / "bad" / "data").exists()
    shard.write_bytes('{"text": "A"}\n\u00a0\n{"text": "B"}\n'.encode())
    with pytest.raises(DedupeError, match=r"s.jsonl line 2: malformed JSON"):
        dedupe(bad)


def shingle_jaccard(a: str, b: str, n: int = 5) -> float:
    x, y = (
        {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}
        for w in (normalize(a).split(), normalize(b).split())
    )
    return len(x & y) / len(x | y)


def test_near_copies_well_above_the_threshold_are_all_found_and_well_below_none(tmp_path):
    """The ends of LSH's S-curve at the default threshold (0.8), with copies of known 5-gram
    Jaccard similarity; between them, benchmarks/curation_recall.py measures it (docs/data.md)."""
    rng = random.Random(11)
    docs = unique_docs(60, seed=12)
    rows, high, low = list(docs), set(), set()
    for k, doc in enumerate(docs[:40]):
        words, similarity = doc.split(" "), 1.0
        target = 0.95 if k < 20 else 0.65
        while similarity > target:  # replace words at random until the similarity falls to it
            words[rng.randrange(len(words))] = f"new{rng.randrange(10**6)}"
            similarity = shingle_jaccard(doc, " ".join(words))
        rows.append(" ".join(words))
        (high if k < 20 else low).add(len(rows) - 1)
        assert (similarity >= 0.89) if k < 20 else (0.6 <= similarity <= 0.65), similarity
    write_jsonl(tmp_path / "in" / "docs.jsonl", rows)
    dedupe(DedupeConfig(inputs=["in"], output=str(tmp_path / "out"), input_root=str(tmp_path)))
    removed = {e["index"] for e in read_evidence(str(tmp_path / "out"))}
    assert high <= removed and not (low & removed) and removed <= high
