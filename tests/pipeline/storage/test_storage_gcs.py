"""GCS conditional writes, against a small GCS JSON-API stand-in on loopback (there is no GCS here).

What this checks is the requests Drydock makes through gcsfs (a media download that reports the
object's generation, a media upload with `ifGenerationMatch`) and how it handles the answers
(412 means re-read and recompute). The stand-in below implements only those two calls, with
GCS's documented generation semantics; it is not GCS, and docs/storage.md says that the GCS path
is untested against the real service.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

import fsspec
import gcsfs
import pytest

from pipeline.core.records import Event
from pipeline.processes import current_owner
from pipeline.storage.files import ConditionalStorage
from pipeline.storage.object_stores import GCSObjects
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, StepStore


class FakeGCS(ThreadingHTTPServer):
    """Objects with generations; every request is recorded as (method, path, query)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str], tuple[bytes, int]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.generations = 1000
        self.lock = threading.Lock()  # one request at a time changes objects, as on GCS

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeGCS

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        self._reply(status, body, {"Content-Type": "application/json"})

    def _record(self) -> tuple[str, dict[str, str]]:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.server.requests.append((self.command, url.path, query))
        return url.path, query

    def do_GET(self) -> None:
        path, query = self._record()
        prefix = "/download/storage/v1/b/"
        if not path.startswith(prefix) or query.get("alt") != "media":
            return self._error(400, f"unsupported request {path}")
        bucket, _, name = path[len(prefix) :].partition("/o/")
        with self.server.lock:
            found = self.server.objects.get((bucket, unquote(name)))
        if found is None:
            return self._error(404, "No such object")
        data, generation = found
        self._reply(200, data, {"x-goog-generation": str(generation)})

    def do_POST(self) -> None:
        path, query = self._record()
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        prefix = "/upload/storage/v1/b/"
        if not path.startswith(prefix) or query.get("uploadType") != "media":
            return self._error(400, f"unsupported request {path}")
        bucket = unquote(path[len(prefix) :].split("/o")[0])
        key = (bucket, query["name"])
        with self.server.lock:
            current = self.server.objects.get(key)
            if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != (
                current[1] if current else 0
            ):
                return self._error(412, "At least one of the pre-conditions you specified did not hold.")
            self.server.generations += 1
            self.server.objects[key] = (body, self.server.generations)
            resource = {"bucket": bucket, "name": key[1], "generation": str(self.server.generations)}
        self._reply(200, json.dumps(resource).encode(), {"Content-Type": "application/json"})


@pytest.fixture
def fake_gcs() -> Iterator[FakeGCS]:
    server = FakeGCS()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def storage(fake_gcs) -> ConditionalStorage:
    fs = gcsfs.GCSFileSystem(endpoint_url=fake_gcs.url, token="anon", skip_instance_cache=True)
    return ConditionalStorage(fs, GCSObjects(fs))


def test_gs_prefixes_get_conditional_writes(monkeypatch):
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})  # as FSSPEC_GS_TOKEN=anon would
    storage = open_storage("gs://bucket/run")
    assert isinstance(storage, ConditionalStorage) and isinstance(storage.objects, GCSObjects)


def test_update_downloads_with_generation_and_uploads_on_condition(storage, fake_gcs):
    path = "gs://bkt/run/step/.lease"
    assert storage.update(path, lambda old: b"one") == b"one"
    assert storage.update(path, lambda old: old + b" two") == b"one two"
    uploads = [q for method, _, q in fake_gcs.requests if method == "POST"]
    assert [(q["name"], q["ifGenerationMatch"]) for q in uploads] == [
        ("run/step/.lease", "0"),  # first write: the object must not exist yet
        ("run/step/.lease", "1001"),  # second: only over the generation that was read
    ]
    downloads = [(p, q) for method, p, q in fake_gcs.requests if method == "GET"]
    # The object name is one path segment: its slashes are percent-encoded, as GCS requires.
    assert downloads[0] == ("/download/storage/v1/b/bkt/o/run%2Fstep%2F.lease", {"alt": "media"})
    assert fake_gcs.objects[("bkt", "run/step/.lease")] == (b"one two", 1002)


def test_a_refused_upload_is_reread_and_recomputed(storage, fake_gcs):
    path = "gs://bkt/counter"
    storage.update(path, lambda old: b"0")
    seen: list[bytes | None] = []

    def increment_after_a_rival(old: bytes | None) -> bytes:
        seen.append(old)
        if len(seen) == 1:  # another writer slips in between our read and our write
            with fake_gcs.lock:
                fake_gcs.generations += 1
                fake_gcs.objects[("bkt", "counter")] = (b"5", fake_gcs.generations)
        return str(int(old or b"0") + 1).encode()

    assert storage.update(path, increment_after_a_rival) == b"6"
    assert seen == [b"0", b"5"]
    assert any(method == "POST" for method, _, _ in fake_gcs.requests)


def test_concurrent_updates_are_all_applied(storage):
    path = f"gs://bkt/{uuid.uuid4().hex}"
    with ThreadPoolExecutor(6) as pool:
        list(
            pool.map(
                lambda _: storage.update(path, lambda old: str(int(old or b"0") + 1).encode()), range(30)
            )
        )
    assert storage.read(path) == b"30"


def test_the_commit_protocol_on_the_stand_in(storage):
    steps = StepStore(storage)
    me = current_owner()
    step = "gs://bkt/run/step-abc"
    assert steps.acquire(step, me, ttl=60) == Acquired(1)
    assert steps.commit(step, me, 1)
    assert [e.event for e in steps.events(step)] == [Event.RUNNING, Event.SUCCESS]
