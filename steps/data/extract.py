"""The `extract` step: web crawl (WARC files of fetched pages) to documents of plain text.

    pages = extract_step("extract/web", inputs=["data/web/crawl-*.warc.gz"], input_root=ROOT)

Each WARC file (`.warc`, `.warc.gz`: gzip members, one a record, as crawls write them) is read
with FastWARC. Each `response` record is one document in: an HTML page with status 200 becomes a
record of the output shard `data/<file>.jsonl.gz`:

    {"id": "<urn:uuid:...>", "url": "http://...", "date": "2026-11-02T03:07:00Z", "text": "..."}

The text is Resiliparse's (`extract_plain_text`, main content only by default: menus, sidebars,
footers, scripts and styles dropped), with the page's encoding detected from its bytes and, with
`fix_unicode`, repaired by ftfy (mojibake such as "donâ€\u2122t" made "don\u2019t" again;
curly quotes are left as they are). Resiliparse was chosen over trafilatura by measurement
(`benchmarks/curation_web.py`, docs/data.md): on the demo crawl's article pages both recover
every paragraph and no menu or footer, and Resiliparse is about ten times faster. The other
records of a file (requests, metadata, warcinfo) are not documents.

A page that gives no document is counted with its reason, never a failed run:

    not_html          the response is not text/html (an image, a PDF)
    http_status       the status is not 200 (a redirect, an error page)
    truncated         the record is shorter than its Content-Length (a cut download)
    empty             no text left after extraction
    extraction_error  the parser raised (the evidence has its message)

and written, as every filter's removals are (`steps.data.filtering`), to `removed/<file>.jsonl`
with the URL and an excerpt; stats.json has the counts and bytes per reason. A file that is not
a WARC at all is an error naming it. A shard is done once `.work/<file>.json` exists, so a
rerun after a kill redoes only unfinished files.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from pipeline import OutputOf, Resources, Step, StepDeclarationError, step_function, this_output, versioned
from pipeline.steplib import (
    EVIDENCE_DIR,
    EXCERPT_CHARS,
    KEPT_DIR,
    KEPT_SAMPLE,
    evidence_line,
)
from steps.data import filtering
from steps.data.filtering import FilterError, Tally
from steps.data.sources import RawDataset
from steps.files import exists, read_json, write_file, write_json

__all__ = ["ExtractConfig", "Page", "extract", "extract_step", "html_to_text", "is_warc", "read_pages"]

EXTRACTORS = ("resiliparse",)
"""The HTML-to-text extractors a step may name (`extractor`)."""


def is_warc(path: str) -> bool:
    """Whether `path` names a WARC file (`.warc`, optionally `.gz`)."""
    return path.lower().endswith((".warc", ".warc.gz"))


@dataclass(frozen=True)
class ExtractConfig:
    """Configuration of the extract step."""

    inputs: list[Any]
    """WARC files: paths, globs, directories, `RawDataset`s or `output_of` a step."""
    output: str
    """The step's output directory (`this_output()`)."""
    extractor: str = "resiliparse"
    """The HTML-to-text extractor (`EXTRACTORS`)."""
    main_content: bool = True
    """Keep only a page's main content (no menus, sidebars, footers)."""
    fix_unicode: bool = True
    """Repair mojibake and other broken Unicode with ftfy."""
    input_root: str | None = None
    """Directory relative inputs are under; not versioned."""
    num_workers: int = 1
    """WARC files processed at once."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs (`steps.data.sources`)."""


def extract_step(
    name: str,
    *,
    inputs: Sequence[str | RawDataset | OutputOf],
    extractor: str = "resiliparse",
    main_content: bool = True,
    fix_unicode: bool = True,
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready extract `Step` (see the module docstring)."""
    if not inputs:
        raise StepDeclarationError(name, "no inputs given", field="inputs")
    if extractor not in EXTRACTORS:
        raise StepDeclarationError(
            name, f"unknown extractor {extractor!r}; one of {', '.join(EXTRACTORS)}", field="extractor"
        )
    for key, value in (("main_content", main_content), ("fix_unicode", fix_unicode)):
        if not isinstance(value, bool):
            raise StepDeclarationError(name, f"{key} must be True or False, got {value!r}", field=key)
    return Step(
        name=name,
        fn=extract,
        config=ExtractConfig(
            inputs=list(inputs),
            output=this_output(),
            extractor=versioned(extractor),
            main_content=versioned(main_content),
            fix_unicode=versioned(fix_unicode),
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned(filtering.inputs_identity(inputs, input_root)),
        ),
        description=f"extract text from web pages: {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


# -- reading WARC files -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One response record of a WARC file."""

    index: int
    """Its place among the file's response records."""
    id: str
    url: str
    date: str
    status: int | None
    """The HTTP status (None: no parsable status line)."""
    content_type: str
    body: bytes
    truncated: bool
    """Shorter than its Content-Length said."""


def read_pages(path: str) -> Iterator[Page]:
    """The response records of the WARC file `path` (a path or URL), in order."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with fsspec.open(path, "rb") as f:
        index = 0
        for record in ArchiveIterator(f, parse_http=False):
            if record.record_type != WarcRecordType.response:
                continue
            block = record.reader.read()
            status, content_type, body = _http(block)
            yield Page(
                index=index,
                id=record.record_id or "",
                url=record.headers.get("WARC-Target-URI", ""),
                date=record.headers.get("WARC-Date", ""),
                status=status,
                content_type=content_type,
                body=body,
                truncated=len(block) < record.content_length,
            )
            index += 1


def _http(block: bytes) -> tuple[int | None, str, bytes]:
    """(status, Content-Type, body) of an HTTP response as a WARC response record holds it."""
    head, _, body = block.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = (
        int(parts[1]) if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].isdigit() else None
    )
    content_type = ""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-type":
            content_type = value.strip()
    return status, content_type, body


def html_to_text(body: bytes, main_content: bool = True, fix_unicode: bool = True) -> str:
    """The plain text of an HTML page given as bytes (see the module docstring)."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import detect_encoding
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse_from_bytes(body, detect_encoding(body))
    text = extract_plain_text(
        tree, main_content=main_content, alt_texts=False, links=False, form_fields=False, noscript=False
    )
    if fix_unicode and _may_need_repair(text):
        import ftfy

        # Repair only: curly quotes stay as the page has them (ftfy straightens them by default).
        text = ftfy.fix_text(text, uncurl_quotes=False)
    return text.strip()


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f&]")


def _may_need_repair(text: str) -> bool:
    """Whether ftfy could change `text`: ASCII text with no control character and no "&" (an
    HTML entity left escaped twice) has nothing it fixes. ftfy reads 3 MB/s; most pages are
    ASCII."""
    return not text.isascii() or _CONTROL.search(text) is not None


def _is_html(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in ("text/html", "application/xhtml+xml")


# -- the step function ------------------------------------------------------------------------------


def extract_inputs(config: ExtractConfig) -> dict[str, dict[str, Any]]:
    """The WARC files the step reads, with fingerprints (`step_function(inputs=...)`)."""
    return filtering.input_listing(config, is_warc)


def _report(config: ExtractConfig) -> str | None:
    if not exists(f"{config.output}/stats.json"):
        return None
    total = read_json(f"{config.output}/stats.json")["total"]
    reasons = ", ".join(f"{r} {v['documents']:,}" for r, v in total["reasons"].items())
    return f"{total['documents_kept']:,} documents from {total['documents_in']:,} pages" + (
        f"; none from: {reasons}" if reasons else ""
    )


@step_function(inputs=extract_inputs, report=_report, check=filtering.check_local_inputs)
def extract(config: ExtractConfig) -> None:
    """Extract the text of `config.inputs`' HTML pages into `config.output`."""
    files = filtering.input_shards(config, is_warc, "a WARC file")
    args = [(config, path, key) for path, key, _source in files]
    parameters = {
        "extractor": config.extractor,
        "main_content": config.main_content,
        "fix_unicode": config.fix_unicode,
    }
    filtering.fan_out(config.output, files, _extract_file, args, config.num_workers, parameters, "WARC files")


def _shard_name(key: str) -> str:
    base = key[: -len(".gz")] if key.lower().endswith(".gz") else key
    return base[: -len(".warc")] + ".jsonl.gz"


def _extract_file(config: ExtractConfig, path: str, key: str) -> tuple[str, dict[str, Any]]:
    work = f"{config.output}/.work/{key}.json"
    if exists(work):
        return key, read_json(work)
    tally, documents, evidence, sample = Tally(), [], [], []
    pages = 0
    try:
        for page in read_pages(path):
            pages += 1
            size = len(page.body)
            tally.seen(size)
            reason, detail, text = _judge_page(config, page)
            record = {"id": page.id, "url": page.url, "date": page.date, "text": text}
            if reason is None:
                documents.append(json.dumps(record, ensure_ascii=False))
                if len(sample) < KEPT_SAMPLE:
                    sample.append(
                        json.dumps(evidence_line(page.index, record, text, None), ensure_ascii=False)
                    )
                continue
            tally.removed(reason, size)
            # The page's own bytes as its excerpt (what there was to extract from), text only.
            shown = (
                page.body[:EXCERPT_CHARS].decode("utf-8", "replace") if "text" in page.content_type else ""
            )
            line = {**evidence_line(page.index, record, shown, reason, None, detail), "bytes": size}
            evidence.append(json.dumps(line, ensure_ascii=False))
    except Exception as e:  # FastWARC's parse errors: the file is not a WARC
        raise FilterError(f"inputs file {path!r}: not a readable WARC file ({type(e).__name__}: {e})") from e
    if pages == 0:
        raise FilterError(f"inputs file {path!r}: no response records (is it a WARC file?)")
    shard = _shard_name(key)
    data = "".join(d + "\n" for d in documents).encode()
    write_file(f"{config.output}/data/{shard}", gzip.compress(data, mtime=0))
    write_file(f"{config.output}/{EVIDENCE_DIR}/{shard}.jsonl", "".join(e + "\n" for e in evidence).encode())
    write_file(f"{config.output}/{KEPT_DIR}/{shard}.jsonl", "".join(e + "\n" for e in sample).encode())
    counts = tally.to_json()
    write_json(work, counts, indent=None)  # last: the file is done
    return key, counts


def _judge_page(config: ExtractConfig, page: Page) -> tuple[str | None, dict[str, Any], str]:
    """(reason, detail, text): the reason None with the page's text, else why it gives none."""
    if page.truncated:
        return "truncated", {"content_type": page.content_type}, ""
    if page.status != 200:
        return "http_status", {"status": page.status}, ""
    if not _is_html(page.content_type):
        return "not_html", {"content_type": page.content_type}, ""
    try:
        text = html_to_text(page.body, config.main_content, config.fix_unicode)
    except Exception as e:  # one page the parser cannot take is one counted page
        return "extraction_error", {"error": f"{type(e).__name__}: {e}"}, ""
    if not text:
        return "empty", {}, ""
    return None, {}, text
