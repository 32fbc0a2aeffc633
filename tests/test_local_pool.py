"""tr_core.parallel.local_pool: one pool held for several map_tasks calls, stopped at once when its block fails."""

import os

import pytest

from tr_core.parallel import local_pool, map_tasks


def _pid_of(x):
    return os.getpid(), x * x


def _boom(x):
    raise ValueError(f"task {x}")


def _gone(p) -> bool:
    """The worker has exited.  ``is_alive`` alone can say "alive" forever about a child whose exit status
    another thread's wait took first (multiprocessing's poll reads ECHILD as "not yet"): ask the kernel too."""
    if not p.is_alive():
        return True
    try:
        with open(f"/proc/{p.pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True             # no such process: exited and reaped
    except (OSError, IndexError):
        return False            # no /proc here: trust is_alive
    return state in ("Z", "X")  # exited, not yet reaped


def test_the_pool_serves_several_calls_with_the_same_workers():
    with local_pool(2) as pool:
        a = map_tasks(_pid_of, [1, 2, 3, 4], executor=pool)
        b = map_tasks(_pid_of, [5, 6, 7, 8], executor=pool, order=[3, 2, 1, 0])
        procs = list(pool._processes.values())
    assert [v for _, v in a] == [1, 4, 9, 16] and [v for _, v in b] == [25, 36, 49, 64]
    pids = {p for p, _ in a + b}
    assert os.getpid() not in pids and pids <= {p.pid for p in procs} and len(procs) <= 2
    assert all(not p.is_alive() for p in procs)             # shut down at the end of the block


def test_a_failing_block_stops_the_workers():
    with pytest.raises(ValueError, match="task"):
        with local_pool(2) as pool:
            map_tasks(_pid_of, [1, 2], executor=pool)
            procs = list(pool._processes.values())
            map_tasks(_boom, [1, 2], executor=pool)
    # a loaded machine may take seconds to deliver the signals: wait generously, then ask how they ended
    for p in procs:
        p.join(60)
    assert procs and all(_gone(p) for p in procs)
    # a worker ended by _stop dies of a signal; one left to the pool's own shutdown would exit with 0
    assert any(p.exitcode is not None and p.exitcode < 0 for p in procs)
