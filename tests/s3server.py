"""moto's standalone S3 server from PyPI, as a real subprocess on 127.0.0.1, for tests.

    with moto_s3() as endpoint:      # "http://127.0.0.1:<port>"
        ...

`s3_environment(endpoint)` is what points boto3/s3fs (and so Drydock, in this process and in
the runners it starts) at the server: the same variables a user sets for any S3-protocol store.
`s3_bucket_environment(bucket)` does all of it for a fixture: server, environment, bucket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO

__all__ = ["moto_s3", "s3_bucket_environment", "s3_environment"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_environment(endpoint: str) -> dict[str, str]:
    """Credentials and endpoint for a test S3 server, as environment variables."""
    return {
        "AWS_ACCESS_KEY_ID": "drydock-test",
        "AWS_SECRET_ACCESS_KEY": "drydock-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
    }


@contextlib.contextmanager
def s3_bucket_environment(bucket: str, **extra: str) -> Iterator[dict[str, str]]:
    """A moto server with `bucket`; this process's environment points at it (plus `extra`
    variables, in which `{endpoint}` stands for the server's URL) until the block ends. Yields the
    variables, for subprocesses."""
    import fsspec
    import s3fs

    with moto_s3() as endpoint:
        variables = {**s3_environment(endpoint), **extra}
        variables = {name: value.format(endpoint=endpoint) for name, value in variables.items()}
        saved = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        s3fs.S3FileSystem.clear_instance_cache()  # instances made before read other settings
        try:
            fsspec.filesystem("s3").mkdir(bucket)
            yield variables
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def moto_s3(timeout: float = 30.0) -> Iterator[str]:
    """Start `moto.server` on a free loopback port, yield its URL, stop it afterwards."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # The server logs every request: into a file, since an unread pipe would fill up and stall it.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            _wait_until_up(proc, endpoint, log, timeout)
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_up(proc: subprocess.Popen, endpoint: str, log: IO[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:  # a bounded wait for the server to answer, not a fixed sleep
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"moto server exited with {proc.returncode}: {log.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not answer on {endpoint} within {timeout}s") from None
            time.sleep(0.05)


if __name__ == "__main__":  # a manual server for benchmarks: prints its URL, runs until Ctrl-C
    with moto_s3() as url:
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
