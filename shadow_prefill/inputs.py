"""Reading ShadowPrefill input files: regular files only, gzip'ed or not, JSON and numbers checked by type.

Every reader of :mod:`shadow_prefill` (session traces, routing matrices and
price files, the Azure request trace, model and GPU configs, saved latency
models) opens its file with :func:`open_input` / :func:`read_input_text` and
checks its fields with :func:`check_int` / :func:`check_float`, so that

* a device, pipe or folder is refused before it is opened (reading one could
  block or never end);
* a file that starts with gzip's magic bytes (or ends in ``.gz``) is read
  decompressed, and one cut short is reported as such in one line;
* JSON nested too deeply or holding an integer literal too long to read is one
  line naming the file, not Python's own message;
* a string where a number belongs is refused, never converted; numbers are
  finite and inside the range a field allows, so what is computed from them
  (sums of tokens in int64, clocks in float64) cannot overflow.

Every error is an :class:`~shadow_prefill.errors.InputFileError` naming the
file (and the line and field where known).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import stat
import zlib
from typing import Any, Callable, TextIO

from shadow_prefill.errors import InputFileError

__all__ = ["open_input", "read_input_text", "parse_json_value", "check_int", "check_float", "short_repr", "stream_error",
           "STREAM_ERRORS", "MAX_TOKENS"]

MAX_TOKENS = 2 ** 40  # tokens or steps of one call or request: far above any model, small enough for exact int64 sums

# what a damaged or truncated compressed stream raises while it is read
STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def stream_error(path: str, e: BaseException, line: int | None = None) -> InputFileError:
    if isinstance(e, EOFError):
        return InputFileError(path, "compressed data cut short (a truncated .gz file)", line)
    if isinstance(e, UnicodeDecodeError):
        return InputFileError(path, f"not UTF-8 text ({e.reason})", line)
    if isinstance(e, (zlib.error, gzip.BadGzipFile)):
        return InputFileError(path, "damaged compressed data (not a readable .gz file)", line)
    if isinstance(e, MemoryError):
        return InputFileError(path, "too large to read into memory", line)
    return InputFileError(path, f"cannot read: {getattr(e, 'strerror', None) or e}", line)


def open_input(path: str | os.PathLike) -> TextIO:
    """A regular file opened for UTF-8 text (decompressed when gzip'ed); one-line errors naming it.

    A device, pipe or folder is refused before it is opened: reading one could block or never end.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except (OSError, ValueError) as e:
        raise stream_error(path, e) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(path, "is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(path, "not a regular file (a device, pipe or socket)")
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise stream_error(path, e) from None
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as e:
        raw.close()
        raise stream_error(path, e) from None
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" or path.endswith(".gz") else raw
    return io.TextIOWrapper(stream, encoding="utf-8", newline=None)


def read_input_text(path: str | os.PathLike) -> str:
    """The whole text of a (possibly gzip'ed) regular file; one-line errors naming it."""
    path = os.fspath(path)
    f = open_input(path)
    try:
        with f:
            return f.read()
    except (OSError, UnicodeDecodeError, MemoryError, *STREAM_ERRORS) as e:
        raise stream_error(path, e) from None


def parse_json_value(text: str, path: str, line: int | None = None) -> Any:
    """``json.loads`` with one-line errors naming the file (deep nesting and overlong integers included)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f" (column {e.colno})" if line is not None else ""
        raise InputFileError(path, f"invalid JSON: {e.msg}{where}", line if line is not None else e.lineno) from None
    except RecursionError:
        raise InputFileError(path, "invalid JSON: nested too deeply", line) from None
    except ValueError as e:  # an integer literal of more than 4300 digits
        raise InputFileError(path, f"invalid JSON: a number too long to read ({str(e).split(':')[0]})", line) from None


def check_int(v: Any, field: str, fail: Callable[[str], Any], lo: int = 0, hi: int = MAX_TOKENS) -> int:
    """``v`` as an int in ``[lo, hi]``: a JSON integer (or an integral float); strings and booleans refused."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        fail(f"field {field!r} must be an integer, got {type(v).__name__} {short_repr(v)}")
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            fail(f"field {field!r} must be an integer, got {short_repr(v)}")
        v = int(v)
    if v < lo:
        fail(f"field {field!r} must be >= {lo}, got {short_repr(v)}")
    if v > hi:
        fail(f"field {field!r} must be <= {hi}, got {short_repr(v)}")
    return v


def check_float(v: Any, field: str, fail: Callable[[str], Any], lo: float = 0.0, hi: float = math.inf,
                unit: str = "") -> float:
    """``v`` as a finite float in ``[lo, hi]``: a JSON number; strings, booleans and overlong integers refused."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        fail(f"field {field!r} must be a number{unit}, got {type(v).__name__} {short_repr(v)}")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or not lo <= x <= hi:
        rng = f">= {lo:g}" + (f" and <= {hi:g}" if math.isfinite(hi) else "")
        fail(f"field {field!r} must be a finite number {rng}{unit}, got {short_repr(v)}")
    return x


def short_repr(v: Any, n: int = 40) -> str:
    """``repr(v)`` cut to ``n`` characters (a value from a file can be huge)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v).bit_length() > 3.33 * n:
        return f"an integer of about {int(abs(v).bit_length() * 0.30103) + 1} digits"
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."
