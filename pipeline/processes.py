"""This machine and its processes: the host's id, whether a process still lives, the owner of a
run started here, Drydock's cache directory on it.

A lease names the host and process that holds it (`pipeline.core.lease.Owner`); a runner on the
same host may take over a lease whose process is gone without waiting for it to expire. Asking
needs the operating system (`/proc`, signal 0), so it lives here, below storage and above the
pure rules of `pipeline.core`, which take it as an argument.
"""

from __future__ import annotations

import os
import socket
import uuid

from pipeline.core.lease import Owner

__all__ = ["cache_dir", "current_owner", "host_id", "pid_alive", "process_start_time", "runner_alive"]


def cache_dir(*parts: str) -> str:
    """Drydock's cache on this machine, or `parts` under it: `$DRYDOCK_CACHE_DIR`, else
    `$XDG_CACHE_HOME/drydock`, else `~/.cache/drydock`. What lives there: JAX's compilation cache
    (`jax/`), compiled layouts (`compiled/`), raw inputs' fingerprints, `drydock cluster`s."""
    base = os.environ.get("DRYDOCK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "drydock"
    )
    return os.path.join(base, *parts)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()[:8]
    except OSError:
        return "noboot"


def host_id() -> str:
    """This machine: hostname plus boot id, so a rebooted host does not trust its old pids."""
    return f"{socket.gethostname()}/{_boot_id()}"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell reused pids apart."""
    fields = _stat(pid)
    return fields[19] if fields is not None else None


def pid_alive(pid: int, start_time: str | None) -> bool:
    """Whether the process `pid` that started at `start_time` still exists on this host. A
    zombie (exited, not yet reaped by its parent) does not: it can write nothing more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc to ask: signal 0 said it exists
    if fields[0] == "Z":
        return False
    return start_time is None or fields[19] == start_time


def runner_alive(runner: object, local_host: str) -> bool | None:
    """Whether the runner a run manifest names (`{"host", "pid", "pid_start"}`) still lives:
    True or False for a runner of this host, None (cannot tell from here) for another host's or a
    manifest without one."""
    if not isinstance(runner, dict) or runner.get("host") != local_host:
        return None
    try:
        return pid_alive(int(runner["pid"]), runner.get("pid_start"))
    except (KeyError, TypeError, ValueError):
        return None


def current_owner() -> Owner:
    """An owner for this process, with a fresh run id."""
    pid = os.getpid()
    return Owner(uuid.uuid4().hex[:12], host_id(), pid, process_start_time(pid))
