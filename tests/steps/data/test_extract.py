"""The extract step: WARC files of fetched pages to documents of text, every page that gives none
counted with its reason and its evidence, never a failed run."""

from __future__ import annotations

import gzip
import json

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from steps.data.extract import ExtractConfig, extract, extract_step, html_to_text, read_pages
from steps.data.filtering import FilterError, read_evidence
from tests.steps.data.warcs import page, request, response, write_warc

STORY = [
    "Ivy had a black coat. She loved the coat very much.",
    "One morning, Ivy went to the school with the coat.",
    "When she came home, the coat was gone! Ivy felt upset.",
]


def crawl(tmp_path):
    """Two WARC files: every kind of page the step must tell apart."""
    first = write_warc(
        tmp_path / "crawl" / "a.warc.gz",
        [
            request("http://a.test/story"),
            response("http://a.test/story", page("A story", STORY)),
            response(
                "http://a.test/cafe",
                page("Café", ["Un café crème, s'il vous plaît."], "windows-1252").encode("cp1252"),
                "text/html; charset=windows-1252",
            ),
            # Text that went through the wrong code page upstream: UTF-8 bytes read as cp1252.
            response(
                "http://a.test/mojibake",
                page("Quote", ["Ivy said: don\u2019t go.".encode().decode("cp1252")]),
            ),
            response("http://a.test/logo.png", b"\x89PNG\r\n\x1a\n\x00\x01", "image/png"),
            response("http://a.test/gone", page("Not found", ["Nothing here."]), status=404),
            response("http://a.test/empty", "<html><head></head><body></body></html>"),
        ],
    )
    second = write_warc(
        tmp_path / "crawl" / "b.warc.gz",
        [
            response("http://b.test/one", page("One", STORY[:2])),
            response("http://b.test/cut", page("Cut", STORY * 20)),
        ],
        cut_last=300,  # the last record's download was interrupted
    )
    return first, second


def test_pages_become_documents_and_every_other_page_is_counted_with_its_reason(tmp_path):
    crawl(tmp_path)
    step = extract_step("extract/web", inputs=["crawl/*.warc.gz"], input_root=str(tmp_path))
    report = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local"))
    assert report.ok
    (out,) = (tmp_path / "prefix" / "extract").glob("web-*")
    docs = [
        json.loads(line)
        for line in gzip.decompress((out / "data/crawl/a.jsonl.gz").read_bytes()).splitlines()
    ]
    assert [d["url"] for d in docs] == ["http://a.test/story", "http://a.test/cafe", "http://a.test/mojibake"]
    story = docs[0]
    assert story["text"] == "A story\n\n" + "\n\n".join(
        STORY
    )  # the title and the article; no menu, footer, script
    assert story["id"].startswith("<urn:uuid:") and story["date"] == "2026-11-02T03:00:00Z"
    assert "Un café crème" in docs[1]["text"]  # decoded as the page's code page
    assert "Ivy said: don\u2019t go." in docs[2]["text"]  # the mojibake repaired
    evidence = {e["url"]: e for e in read_evidence(str(out))}
    assert {url: e["reason"] for url, e in evidence.items()} == {
        "http://a.test/logo.png": "not_html",
        "http://a.test/gone": "http_status",
        "http://a.test/empty": "empty",
        "http://b.test/cut": "truncated",
    }
    assert evidence["http://a.test/gone"]["detail"] == {"status": 404}
    assert evidence["http://a.test/logo.png"]["detail"] == {"content_type": "image/png"}
    assert evidence["http://a.test/empty"]["excerpt"].startswith("<html>")
    assert evidence["http://a.test/logo.png"]["excerpt"] == ""  # no bytes of an image shown as text
    stats = json.loads((out / "stats.json").read_text())["total"]
    assert (stats["documents_in"], stats["documents_kept"]) == (8, 4)  # responses only: no request
    assert {r: v["documents"] for r, v in stats["reasons"].items()} == {
        "empty": 1,
        "http_status": 1,
        "not_html": 1,
        "truncated": 1,
    }
    assert stats["bytes_removed"] == sum(e["bytes"] for e in evidence.values())


def test_main_content_off_keeps_the_menu_and_footer():
    html = page("A story", STORY).encode()
    assert "Copyright" not in html_to_text(html)
    assert "Copyright 2026" in html_to_text(html, main_content=False)


def test_a_rerun_redoes_only_unfinished_files_and_a_file_that_is_not_a_warc_is_named(tmp_path):
    crawl(tmp_path)
    config = ExtractConfig(inputs=["crawl"], output=str(tmp_path / "out"), input_root=str(tmp_path))
    extract(config)
    done = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").rglob("*") if p.is_file()}
    (tmp_path / "out" / ".work" / "crawl" / "b.warc.gz.json").unlink()  # as if killed while writing b
    extract(config)
    changed = {p.name for p, t in done.items() if p.exists() and p.stat().st_mtime_ns != t}
    assert changed == {"b.jsonl.gz", "b.jsonl.gz.jsonl", "b.warc.gz.json", "stats.json"}
    (tmp_path / "crawl" / "c.warc.gz").write_bytes(gzip.compress(b'{"text": "not a crawl"}\n'))
    with pytest.raises(
        FilterError, match=r"c\.warc\.gz'?: no response records|c\.warc\.gz'?: not a readable WARC"
    ):
        extract(config)


def test_read_pages_reports_a_cut_record(tmp_path):
    _first, second = crawl(tmp_path)
    pages = list(read_pages(str(second)))
    assert [(p.url, p.status, p.truncated) for p in pages] == [
        ("http://b.test/one", 200, False),
        ("http://b.test/cut", 200, True),
    ]


def test_bad_declarations_name_the_field():
    with pytest.raises(StepDeclarationError, match="extractor"):
        extract_step("extract/x", inputs=["a.warc.gz"], extractor="lynx")
    with pytest.raises(StepDeclarationError, match="main_content"):
        extract_step("extract/x", inputs=["a.warc.gz"], main_content="yes")
    with pytest.raises(StepDeclarationError, match="no inputs"):
        extract_step("extract/x", inputs=[])
