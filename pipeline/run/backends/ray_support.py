"""What the Ray backend (`pipeline.run.backends.ray`) needs that is not Ray itself: a gang
process's environment, a free port for JAX's coordinator, a fast check that a cluster address
answers, a loopback address for a private instance, Ray's tracebacks without colour codes."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator

from pipeline.errors import StepDeclarationError
from pipeline.run.in_step.gang import Gang

__all__ = [
    "captured_stderr",
    "check_reachable",
    "free_port",
    "gang_env",
    "join_error",
    "plain_text",
    "private_ip",
    "quiet_auth_notice",
]


def quiet_auth_notice() -> None:
    """Ray's "Token authentication is enabled for this Ray cluster" warning, printed whenever a
    private instance starts: a notice about a default, not a problem (`make run` stays quiet)."""
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def free_port() -> int:
    """Runs on a gang's host 0: a port free there now, for JAX's distributed coordinator."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def gang_env(gang: Gang) -> dict[str, str]:
    """A gang process's place as environment variables too, for code that reads no context
    (a subprocess the step starts)."""
    env = {"DRYDOCK_GANG_INDEX": str(gang.index), "DRYDOCK_GANG_SIZE": str(gang.size)}
    if gang.coordinator:
        env["DRYDOCK_GANG_COORDINATOR"] = gang.coordinator
    return env


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain_text(text: str) -> str:
    """Text without terminal colour codes (Ray colours its tracebacks)."""
    return _ANSI.sub("", text)


def check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast, instead of retrying for minutes, when a `host:port` cluster address is down."""
    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except (OSError, ValueError) as e:
        raise StepDeclarationError(
            None, f"cannot reach a Ray cluster at {address!r}: {e}", field="--ray_address"
        ) from e


def private_ip() -> str | None:
    """A loopback address for a private instance. Ray rewrites 127.0.0.1 to the machine's
    network address, but not the rest of 127/8, which Linux routes to loopback as well."""
    return "127.0.0.2" if sys.platform.startswith("linux") else None


@contextlib.contextmanager
def captured_stderr() -> Iterator[Callable[[], str]]:
    """Everything written to file descriptor 2 inside the block (Ray's C++ core writes there
    directly), kept instead of shown; yields a function that returns it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        text: list[str] = []

        def said() -> str:
            return "".join(text)

        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


def join_error(address: str, error: BaseException, said: str) -> StepDeclarationError:
    """One line for a driver that could not join the cluster at `address`: Ray retries for a while,
    printing a warning a second, and then raises a bare ConnectionError."""
    if "InvalidAuthToken" in said or "Unauthenticated" in said:
        why = (
            "the cluster refuses this driver's token (InvalidAuthToken). Ray 2.60's `ray start` turns "
            "token authentication on: run with RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN_PATH=<its token "
            "file> unless it is ~/.ray/auth_token, as its nodes were started (a cluster from "
            "`drydock cluster start` needs nothing: Drydock finds its token)"
        )
    else:
        last = [line for line in plain_text(said).splitlines() if line.strip()][-1:]
        why = f"{type(error).__name__}: {error}" + (f" (Ray said: {last[0].strip()})" if last else "")
    message = f"cannot join the Ray cluster at {address!r}: {why}"
    return StepDeclarationError(None, message, field="--ray_address")
