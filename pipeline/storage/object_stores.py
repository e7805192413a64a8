"""Talking to remote object stores: which errors to retry, how long to wait, conditional writes.

Imported only by `pipeline.storage.files`, which stays the one module that opens files under a prefix.
It holds three things:

  * the retry policy: `backoff_delay` (a pure function: exponential backoff with full jitter,
    capped) and `retrying` (the wrapper that applies it and turns what is left into a
    `StorageError` naming the path and the cause);
  * `is_transient`: which errors are worth another try (timeouts, dropped connections, HTTP 5xx,
    408, 429 and S3's SlowDown/throttling codes) and which are not (403, a missing bucket, ...);
  * `S3Objects` and `GCSObjects`: read an object together with its version (S3 ETag, GCS
    generation) and write it only if that version is still current (S3 `If-Match` /
    `If-None-Match: *`, GCS `ifGenerationMatch`, 0 for "must not exist"). `storage.py` builds
    its atomic read-modify-write on these two calls.

botocore, aiohttp and gcsfs errors are recognised by their class names and attributes rather
than by importing those libraries: planning (which imports this module) must not pay for them.
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import fsspec

from pipeline.errors import StorageAccessDenied, StorageError

__all__ = [
    "CONDITIONAL_PROTOCOLS",
    "CONTENTION",
    "DEFAULT_RETRY",
    "ConditionalObjects",
    "GCSObjects",
    "RetryPolicy",
    "S3Objects",
    "backoff_delay",
    "describe_error",
    "error_code",
    "is_missing_bucket",
    "is_transient",
    "open_object_store",
    "retrying",
]

T = TypeVar("T")

CONDITIONAL_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs"})
"""Prefix protocols whose leases and status commits use the store's conditional writes."""


# ---------------------------------------------------------------------------------------------
# Retry policy.


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a storage operation is retried after a transient error."""

    tries: int = 8
    """Attempts in all, the first included."""
    base: float = 0.1
    """Seconds: the ceiling of the first wait; it doubles after every failed try."""
    cap: float = 10.0
    """Seconds: no single wait exceeds this."""


DEFAULT_RETRY = RetryPolicy()
"""8 tries, waits drawn below 0.1, 0.2, ... 6.4 s: at most 12.7 s of waiting in all."""
CONTENTION = RetryPolicy(tries=64, base=0.01, cap=0.5)
"""Conditional writes lost to other writers: re-read after a short jittered pause, 64 times at most."""


def backoff_delay(attempt: int, policy: RetryPolicy, uniform: float) -> float:
    """Seconds to wait after failed try number `attempt` (1-based), given `uniform` in [0, 1).

    Full jitter (a uniform draw below the exponential ceiling): runners that failed together
    do not retry together, which is what keeps a throttled bucket from being hit in waves.
    """
    return uniform * min(policy.cap, policy.base * 2 ** (attempt - 1))


_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
_TRANSIENT_STATUS = frozenset({408, 429})
_TRANSIENT_CLASSES = frozenset(
    {
        # botocore
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "HTTPClientError",
        "ResponseParserError",
        "IncompleteReadError",
        # aiohttp
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        # requests (gcsfs maps 502 to ProxyError), gcsfs, fsspec
        "ConnectionError",
        "ProxyError",
        "ChunkedEncodingError",
        "ChecksumError",
        "FSTimeoutError",
    }
)
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.EAGAIN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    }
)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was raised from (s3fs wraps botocore errors in OSError)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _response(error: BaseException) -> tuple[str, int | None]:
    """The error code and HTTP status of a botocore ClientError or gcsfs HttpError, else ("", None)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(response["Error"].get("Code", "")), int(status) if status else None
    if type(error).__name__ == "HttpError":
        code = getattr(error, "code", None)
        try:
            return "", int(code) if code is not None else None
        except (TypeError, ValueError):
            return "", None
    return "", None


def error_code(error: BaseException) -> str:
    """The S3 error code (`NoSuchKey`, `PreconditionFailed`, ...) behind `error`, or ""."""
    for link in _chain(error):
        code, _ = _response(link)
        if code:
            return code
    return ""


_DENIED_CODES = frozenset({"AccessDenied", "Forbidden", "403", "AllAccessDisabled"})


def is_access_denied(error: BaseException) -> bool:
    """Whether the store refused access: a local permission error, or a 403 from a server."""
    for link in _chain(error):
        code, status = _response(link)
        if isinstance(link, PermissionError) or code in _DENIED_CODES or status == 403:
            return True
    return False


def is_transient(error: BaseException) -> bool:
    """Whether another try may succeed: timeouts, lost connections, 5xx, 408, 429, throttling."""
    for link in _chain(error):
        code, status = _response(link)
        if (
            code in _TRANSIENT_CODES
            or status in _TRANSIENT_STATUS
            or ((status or 0) >= 500 and status != 501)  # 501: the server cannot do it, ever
        ):
            return True
        if code or status is not None:
            return False  # the server answered, and not with something worth retrying
        if isinstance(link, (TimeoutError, ConnectionError)):
            return True
        if any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(link).__mro__):
            return True
        if isinstance(link, OSError) and link.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def is_missing_bucket(error: BaseException) -> bool:
    """Whether a not-found error is about the bucket rather than the object (a permanent error)."""
    return error_code(error) == "NoSuchBucket"


def describe_error(error: BaseException) -> str:
    """One line for a storage error: its type, the server's code if any, and its message."""
    code = error_code(error)
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    name = type(error).__name__
    if code and code not in text:
        name = f"{name} ({code})"
    return f"{name}: {text}" if text else name


def retrying(
    what: str,
    path: str,
    op: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    uniform: Callable[[], float] = random.random,
) -> T:
    """`op()`, retried under `policy` while it fails transiently.

    A permanent error, or a transient one that outlasts the policy, becomes a `StorageError`
    naming `what` was done to `path` and the cause. A `StorageError` raised by `op` passes as is.
    """
    for attempt in range(1, policy.tries + 1):
        try:
            return op()
        except StorageError:
            raise
        except Exception as e:
            if is_access_denied(e):
                raise StorageAccessDenied(
                    f"cannot {what} {path}: permission denied ({describe_error(e)})"
                ) from e
            if not is_transient(e):
                raise StorageError(f"cannot {what} {path}: {describe_error(e)}") from e
            if attempt == policy.tries:
                raise StorageError(
                    f"cannot {what} {path}: still failing after {policy.tries} tries: {describe_error(e)}"
                ) from e
            sleep(backoff_delay(attempt, policy, uniform()))
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Conditional requests.


class ConditionalObjects(Protocol):
    """Versioned reads and conditional writes of whole objects on one store."""

    def get(self, path: str) -> tuple[bytes | None, str | None]:
        """The object's content and version, or (None, None) if it does not exist."""
        ...

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        """Write `data` if the object is still at `version` (None: still absent); False if not."""
        ...


async def _read_body(body: Any) -> bytes:
    try:
        return await body.read()
    finally:
        body.close()


class S3Objects:
    """S3 (and S3-protocol stores) through s3fs: GET with its ETag, PUT with `If-Match`.

    A PUT conditioned on `If-Match: <etag>` (or `If-None-Match: *` for a new object) fails with
    412 PreconditionFailed if another writer got there first, or 409 ConditionalRequestConflict
    while a concurrent write to the key is in flight; 404 NoSuchKey under `If-Match` means the
    object was deleted meanwhile. All three mean "re-read and try again", so `put_if` says False.
    """

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def get(self, path: str) -> tuple[bytes | None, str | None]:
        bucket, key, _ = self.fs.split_path(path)
        try:
            response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError as e:
            if is_missing_bucket(e):
                raise
            return None, None
        data = fsspec.asyn.sync(self.fs.loop, _read_body, response["Body"])
        return data, response["ETag"]

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except OSError as e:
            if error_code(e) in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"):
                return False
            raise
        finally:
            self.fs.invalidate_cache(path)
        return True


class GCSObjects:
    """Google Cloud Storage through gcsfs: GET with its generation, upload with `ifGenerationMatch`.

    The upload is the JSON API's single-request media upload with `ifGenerationMatch=<generation>`
    (`0`: the object must not exist yet); GCS answers 412, which gcsfs raises as FileExistsError,
    when the generation moved on. Not tested against real GCS (see docs/storage.md).
    """

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def get(self, path: str) -> tuple[bytes | None, str | None]:
        try:
            headers, data = self.fs.call("GET", self.fs.url(path))
        except FileNotFoundError:
            return None, None
        return data, headers["x-goog-generation"]

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        try:
            self.fs.call(
                "POST",
                f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                uploadType="media",
                name=key,
                ifGenerationMatch=version if version is not None else "0",
                headers={"Content-Type": "application/octet-stream"},
                data=data,
                json_out=True,
            )
        except FileExistsError:
            return False
        finally:
            self.fs.invalidate_cache(path)
        return True


def open_object_store(protocol: str) -> tuple[fsspec.AbstractFileSystem, ConditionalObjects] | None:
    """The filesystem and conditional requests for `protocol`, or None if it has none.

    S3 is opened with s3fs's and botocore's own retries turned off, so that the policy above is
    the only one (retry layers multiply: 5 x 5 x 8 tries is not what anyone configured). Other
    s3fs options still come from fsspec's configuration (FSSPEC_S3_* variables, config files).
    """
    if protocol in ("s3", "s3a"):
        configured = fsspec.config.conf.get("s3", {})
        config_kwargs = {**configured.get("config_kwargs", {}), "retries": {"total_max_attempts": 1}}
        fs = fsspec.filesystem("s3", config_kwargs=config_kwargs)
        fs.retries = 1  # a class attribute in s3fs, not a constructor option
        return fs, S3Objects(fs)
    if protocol in ("gs", "gcs"):
        # gcsfs retries 5xx inside every request and offers no switch; our policy sits on top.
        fs = fsspec.filesystem("gs")
        return fs, GCSObjects(fs)
    return None
