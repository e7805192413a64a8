"""WARC files written by hand for the curation tests: records as a crawler writes them, one gzip
member each."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path


def record(kind: str, url: str, block: bytes, content_type: str, number: int = 0) -> bytes:
    headers = [
        "WARC/1.1",
        f"WARC-Type: {kind}",
        f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{number:012d}>",
        "WARC-Date: 2026-11-02T03:00:00Z",
        f"WARC-Target-URI: {url}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(block)}",
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def response(
    url: str, body: bytes | str, content_type: str = "text/html; charset=utf-8", status: int = 200
) -> bytes:
    """A response record: an HTTP response with `body`."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    reason = {200: "OK", 301: "Moved Permanently", 404: "Not Found"}.get(status, "X")
    http = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return record(
        "response", url, http.encode() + body, "application/http; msgtype=response", zlib.crc32(url.encode())
    )


def request(url: str) -> bytes:
    return record("request", url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "application/http; msgtype=request")


def write_warc(path: Path, records: list[bytes], cut_last: int = 0) -> Path:
    """Write `records` as a .warc.gz; `cut_last` bytes cut off the end (a truncated download)."""
    data = b"".join(gzip.compress(r, mtime=0) for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - cut_last] if cut_last else data)
    return path


def page(title: str, paragraphs: list[str], charset: str = "utf-8") -> str:
    """An HTML page with a menu, a footer and a script around an article of `paragraphs`."""
    main = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        f'<!DOCTYPE html><html><head><meta charset="{charset}"><title>{title}</title>'
        "<script>var tracker = 1;</script><style>p { color: black; }</style></head><body>"
        '<nav><ul><li><a href="/">Home</a></li><li><a href="/shop">Shop</a></li></ul></nav>'
        f"<main><article><h1>{title}</h1>{main}</article></main>"
        "<footer><p>Copyright 2026 Example Media. All rights reserved.</p></footer></body></html>"
    )
