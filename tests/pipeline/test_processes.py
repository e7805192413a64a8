"""This machine's processes: liveness that tells a reused pid and a zombie from the process a
lease names."""

import os
import subprocess
import sys
import time

from pipeline.processes import current_owner, host_id, pid_alive, process_start_time


def test_the_current_owner_is_this_process_on_this_host_with_a_fresh_run_id():
    one, two = current_owner(), current_owner()
    assert (
        one.pid == os.getpid() and one.host == host_id() and one.pid_start == process_start_time(os.getpid())
    )
    assert one.run_id != two.run_id


def test_pid_alive_checks_start_time_against_pid_reuse():
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None
    assert pid_alive(me, start)
    assert not pid_alive(me, "1")  # same pid, different process start: a reused pid


def test_an_exited_process_not_yet_reaped_is_not_alive():
    """A killed runner whose parent has not reaped it yet is a zombie: signal 0 still reaches
    it, but it writes nothing more, so its leases may be taken over and its workers fenced."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start_time(child.pid)
        assert pid_alive(child.pid, start)
        child.kill()
        deadline = time.monotonic() + 10
        while pid_alive(child.pid, start) and time.monotonic() < deadline:
            time.sleep(0.01)  # the kill is delivered asynchronously; it is not reaped meanwhile
        assert not pid_alive(child.pid, start)
        os.kill(child.pid, 0)  # still there, as a zombie
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid, start)


def test_drydocks_cache_is_drydock_cache_dir_else_xdg_else_home(monkeypatch, tmp_path):
    from pipeline.processes import cache_dir

    monkeypatch.delenv("DRYDOCK_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir("jax") == str(tmp_path / "home" / ".cache" / "drydock" / "jax")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("clusters", "c1") == str(tmp_path / "xdg" / "drydock" / "clusters" / "c1")
    monkeypatch.setenv("DRYDOCK_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == str(tmp_path / "mine")
