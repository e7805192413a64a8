"""A fault-injecting fsspec filesystem for tests: wrap a real filesystem, make chosen calls misbehave.

    inner = fsspec.filesystem("memory")
    fs = FaultFS(inner, [Fault("pipe_file", "lost_reply", path="*/.status")])
    storage = Storage(fs, sleep=lambda s: None)

Every call goes to the wrapped filesystem (after waiting while `outage` is set: the store is
down), except that a matching `Fault` first (or instead) does one of:

  * `error`       raise `fault.error()` before the call reaches the store (it never happened);
  * `lost_reply`  make the call, then raise: the store changed but the caller cannot know;
  * `delay`       sleep `fault.seconds`, then make the call;
  * `partial`     (pipe_file only) write the first `fault.keep` fraction of the bytes, then raise.

Faults match on the operation name (`cat_file`, `pipe_file`, `ls`, `rm`, `info`, `open`,
`makedirs`, or `s3.<method>` for s3fs's `call_s3`, e.g. `s3.put_object`; `*` for any) and on
the path (an fnmatch pattern on the path without its `proto://`). `skip` lets that many matching
calls through first; `times` is how many it then hits (-1: all). Besides the fixed list,
`rate` > 0 makes every call fail at random with that probability, drawn from `seed`, with one of
`random_kinds`: a reproducible stress mode. `injected` records every fault as (op, path, kind).
Other attributes (s3fs's `split_path`, `loop`, ...) pass through to the wrapped filesystem.
"""

from __future__ import annotations

import fnmatch
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import fsspec

__all__ = ["KINDS", "Fault", "FaultFS", "injected_timeout"]

KINDS = ("error", "lost_reply", "delay", "partial")


def injected_timeout() -> BaseException:
    """The default injected error: a timeout, which storage treats as transient."""
    return TimeoutError("injected timeout")


@dataclass
class Fault:
    """One rule: which calls it hits and what it does to them."""

    op: str
    """Operation name (`pipe_file`, `s3.put_object`, ...) or `*`."""
    kind: str = "error"
    """One of KINDS."""
    path: str = "*"
    """fnmatch pattern on the path without `proto://`."""
    times: int = 1
    """Matching calls to hit after `skip`; -1 for all of them."""
    skip: int = 0
    """Matching calls to let through before the first hit."""
    error: Callable[[], BaseException] = injected_timeout
    """Makes the exception to raise (error, lost_reply, partial)."""
    seconds: float = 0.0
    """How long a `delay` stalls."""
    keep: float = 0.5
    """Fraction of the bytes a `partial` write keeps."""
    seen: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; use one of {', '.join(KINDS)}")

    def claim(self, op: str, path: str) -> bool:
        """Whether this rule hits this call (and count it)."""
        if self.op not in ("*", op) or not fnmatch.fnmatchcase(path, self.path):
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        return self.times < 0 or self.seen - self.skip <= self.times


def _bare(path: str) -> str:
    return path.split("://", 1)[-1]


class FaultFS(fsspec.AbstractFileSystem):
    """`inner` with faults injected into its calls (see the module docstring)."""

    protocol = "faulty"
    cachable = False  # each test's rules are its own; fsspec must not hand out a cached wrapper

    def __init__(
        self,
        inner: fsspec.AbstractFileSystem,
        faults: Iterable[Fault] = (),
        *,
        rate: float = 0.0,
        seed: int = 0,
        random_kinds: tuple[str, ...] = ("error",),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.inner = inner
        self.faults = list(faults)
        self.rate = rate
        self.random_kinds = random_kinds
        self.injected: list[tuple[str, str, str]] = []
        self.outage = threading.Event()
        """While set, the store is down: every call waits (as on a hung NFS mount or a frozen
        server) until it is cleared, then goes through."""
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    # -- choosing and applying faults -----------------------------------------------------------

    def _pick(self, op: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.claim(op, path):
                    break
            else:
                if self.rate <= 0 or self._rng.random() >= self.rate:
                    return None
                kinds = [k for k in self.random_kinds if k != "partial" or op == "pipe_file"] or ["error"]
                fault = Fault(op, self._rng.choice(kinds), keep=self._rng.random())
            self.injected.append((op, path, fault.kind))
            return fault

    def _call(self, op: str, path: str, call: Callable[[], Any], data: bytes | None = None) -> Any:
        while self.outage.is_set():
            time.sleep(0.01)
        fault = self._pick(op, _bare(path))
        if fault is None:
            return call()
        if fault.kind == "error":
            raise fault.error()
        if fault.kind == "delay":
            time.sleep(fault.seconds)
            return call()
        if fault.kind == "partial" and data is not None:
            self.inner.pipe_file(path, data[: int(len(data) * fault.keep)])
            raise fault.error()
        call()  # lost_reply (and partial on a call without data): the call happens, the reply is lost
        raise fault.error()

    # -- the filesystem interface storage uses --------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        return self._call("cat_file", path, lambda: self.inner.cat_file(path, start, end, **kwargs))

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self._call("pipe_file", path, lambda: self.inner.pipe_file(path, value, **kwargs), data=value)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        return self._call("ls", path, lambda: self.inner.ls(path, detail=detail, **kwargs))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._call("info", path, lambda: self.inner.info(path, **kwargs))

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._call("rm", path, lambda: self.inner.rm(path, recursive=recursive, maxdepth=maxdepth))

    def rm_file(self, path: str) -> None:
        self._call("rm", path, lambda: self.inner.rm_file(path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._call("makedirs", path, lambda: self.inner.makedirs(path, exist_ok=exist_ok))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self._call("open", path, lambda: self.inner.open(path, mode, **kwargs))

    def invalidate_cache(self, path: str | None = None) -> None:
        self.inner.invalidate_cache(path)

    def _parent(self, path: str) -> str:  # type: ignore[override]
        return self.inner._parent(path)

    def call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """s3fs's `call_s3`, faulted as `s3.<method>` on `<Bucket>/<Key>`."""
        path = f"{kwargs.get('Bucket', '')}/{kwargs.get('Key', '')}"
        return self._call(f"s3.{method}", path, lambda: self.inner.call_s3(method, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes FaultFS lacks: s3fs's split_path, loop, ... come unfaulted.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
