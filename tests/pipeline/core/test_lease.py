"""Lease staleness rules, with time and process liveness passed in."""

from pipeline.core.lease import LeaseRecord, LeaseWatch, is_stale


def lease(host: str = "h/1", expires: float = 100.0, released: bool = False) -> LeaseRecord:
    return LeaseRecord(
        token=3, run_id="r", host=host, pid=123, pid_start="9", expires=expires, released=released
    )


def test_absent_released_and_expired_leases_are_stale():
    assert is_stale(None, 0, "h/1")
    assert is_stale(lease(released=True), 0, "h/1", alive=lambda pid, start: True)
    assert is_stale(lease(expires=100), 100, "other/1")
    assert not is_stale(lease(expires=100), 99.9, "other/1")


def test_a_skew_allowance_delays_expiry_by_the_readers_clock():
    live = lease(expires=100)
    assert not is_stale(live, 159.9, "other/1", skew=60)  # a reader up to 60 s ahead: still held
    assert is_stale(live, 160, "other/1", skew=60)
    assert is_stale(lease(released=True), 0, "other/1", skew=60)  # released: at once, as before
    assert is_stale(lease(host="h/1"), 0, "h/1", alive=lambda pid, start: False, skew=60)


def test_a_watch_calls_a_lease_stale_once_it_has_stayed_the_same_for_the_timeout():
    now = [0.0]
    watch = LeaseWatch(10.0, clock=lambda: now[0])
    first = lease(expires=1e12)  # whatever `expires` says: only change over time counts
    assert not watch.unchanged("a", first)
    now[0] = 9.5
    assert not watch.unchanged("a", first)
    now[0] = 10.0
    renewed = lease(expires=1e12 + 30)  # a heartbeat: the wait starts again
    assert not watch.unchanged("a", renewed)
    now[0] = 19.5
    assert not watch.unchanged("a", renewed)
    now[0] = 20.0
    assert watch.unchanged("a", renewed)
    assert not watch.unchanged("b", renewed)  # each step is watched on its own
    assert not watch.unchanged("a", None)  # no lease: nothing to watch (absent is stale anyway)
    assert not watch.unchanged("a", renewed)  # a fresh watch after that
    watch.forget("a")
    now[0] = 100.0
    assert not watch.unchanged("a", renewed)


def test_a_dead_local_owner_makes_the_lease_stale_before_expiry():
    assert is_stale(lease(host="h/1"), 0, "h/1", alive=lambda pid, start: False)
    assert not is_stale(lease(host="h/1"), 0, "h/1", alive=lambda pid, start: True)
    # On another host we cannot see the process: only expiry counts.
    assert not is_stale(lease(host="h/1"), 0, "h/2", alive=lambda pid, start: False)


def test_record_round_trip():
    record = lease()
    assert LeaseRecord.parse(record.dump()) == record
