r"""The command lines keep freed memory in their heap instead of handing it back to the system at once.

A chain of millions of states is built and solved in arrays of hundreds of megabytes, grown by doubling
and freed at the end of each solve.  glibc serves every such block by a fresh ``mmap`` and returns it by
``munmap``, so each solve touches all its memory for the first time again: one page fault per 4 KiB page.
On the virtual machines these tools run on a fault costs several microseconds (6.4 us measured on the
project's 2-core machine), and a three-model search spent a sixth of its time in the kernel doing that.
With large blocks taken from the ordinary heap and the heap trimmed only when gigabytes lie free at its top,
later solves reuse pages already mapped.  Measured side by side (benchmarks/RESULTS.md, "Heap"): ME at N = 10
266 s -> 222 s (system time 44 s -> 13 s, peak 2.46 -> 2.54 GB); where the chains are smaller the system time
still falls (ME N = 8: 4.3 s -> 1.0 s; R2R N = 192: 8.1 s -> 3.4 s) but the wall time does not (0.93 and 0.97
of the default's speed in that run, within the machine's noise: two more ME N = 8 pairs gave 58.6 / 58.9 s and
66.2 / 62.5 s).

Only the command lines do this (:func:`keep_heap`, called by :func:`tr_core.cli.run_cli` when it runs a
console script): a program that imports the library keeps its own allocator settings.  The worker
processes a command spawns inherit the same settings through glibc's environment variables.  Nothing is
changed where the allocator is not glibc's, where the user already set any of those variables, or with
``TR_MODEL_KEEP_HEAP=0`` in the environment (glibc's defaults, as a library caller has them).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# the heap is trimmed when this much lies free at its top (the largest value mallopt takes: an int)
TRIM_THRESHOLD_BYTES = 2**31 - 1
# the variables that carry the settings into spawned workers, and those that mean the user chose already
_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}
_USER_SET = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
             "GLIBC_TUNABLES")


def keep_heap(environ=None) -> bool:
    """Serve large blocks from the heap and trim it only above :data:`TRIM_THRESHOLD_BYTES`, in this process
    and in the processes it spawns; True when the settings were applied.

    ``environ`` (default ``os.environ``): where the spawned workers' settings are written.  Does nothing and
    returns False off Linux, without glibc, when any of the allocator's variables is already set, or when
    ``TR_MODEL_KEEP_HEAP`` is ``0``.
    """
    env = os.environ if environ is None else environ
    if (not sys.platform.startswith("linux") or any(k in env for k in _USER_SET)
            or env.get("TR_MODEL_KEEP_HEAP", "1").strip() == "0"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if not (mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) and mallopt(_M_MMAP_MAX, 0)):
        return False
    env.update(_ENV)
    return True
