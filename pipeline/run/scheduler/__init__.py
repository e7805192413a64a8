"""The scheduler: the run loop (`executor`), one attempt of one step (`attempt`) and how it
ends (`endings`, `crashes`), the runner's leases (`heartbeat`), hung attempts (`watchdog`), the
budget (`budget`), and adopting a directory as a step's output (`adopt`: its lease, fence and
commit, as an attempt's)."""
