"""Helpers shared by the project's command-line tools: one-line errors, N ranges, progress, tables."""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from typing import Sequence

from tr_core.errors import SpecError, TRError


class Parser(argparse.ArgumentParser):
    """argparse with the project's error convention: one ``error:`` line on stderr, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def fail(message: str, code: int = 2):
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(code)


def run_cli(fn, argv=None) -> int:
    """Run ``fn(argv)``, turning user errors into one ``error:`` line and an exit code."""
    try:
        return int(fn(argv) or 0)
    except TRError as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__, e.exit_code)
    except (ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__, 2)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130)
    except BrokenPipeError:
        return 0
    return 0


def parse_int_list(values: Sequence[str], flag: str, lo: int = 1) -> list[int]:
    """Parse ``["1", "4-8", "16"]`` (also comma-separated) into sorted unique integers."""
    out: list[int] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    a, b = part.split("-", 1) if not part.startswith("-") else ("-" + part[1:].split("-", 1)[0],
                                                                                 part[1:].split("-", 1)[1])
                    a_i, b_i = int(a), int(b)
                    if b_i < a_i:
                        raise SpecError(f"{flag}: empty range {part!r}")
                    out.extend(range(a_i, b_i + 1))
                else:
                    out.append(int(part))
            except ValueError:
                raise SpecError(f"{flag}: {part!r} is not an integer or a range like 1-16") from None
    bad = [x for x in out if x < lo]
    if bad:
        raise SpecError(f"{flag} must be >= {lo}, got {bad[0]}")
    return sorted(set(out))


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal and when not quiet."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        fill = int(width * done / max(total, 1))
        el = now - self.t0
        eta = el / done * (total - done) if done else 0.0
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} "
                         f"{el:5.1f}s eta {eta:5.1f}s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def format_table(headers: Sequence[str], rows: Sequence[Sequence], aligns: str | None = None) -> str:
    """A plain-text table; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    aligns = aligns or "".join("l" if i == 0 else "r" for i in range(len(headers)))
    lines = []
    for n, r in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, aligns)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_csv(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    w.writerows(rows)
    return buf.getvalue()


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
