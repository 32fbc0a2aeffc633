"""Atomic file writes shared by every tool of the project.

A file is written to a temporary name in its destination folder, flushed and
fsync'ed, given ordinary permissions (``0666`` less the umask, as ``open``
would), and renamed over the destination in one step.  Readers therefore see
the old file or the new one, never a half-written one, and on any failure the
temporary file is removed and the old file stays as it was.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import IO, Any, Callable

from tr_core.errors import SpecError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class signals_deferred:
    """Hold SIGINT and SIGTERM back for a short critical section (creating, writing and renaming a temporary
    file): a signal that arrives inside is raised when the section ends, so no temporary file is left between
    its creation and the line that would clean it up.

    Two layers, because blocking a signal in one thread does not stop it: the kernel hands a process-directed
    signal to any thread that does not block it (numpy's BLAS threads, a helper thread), and Python then runs
    its handler in the main thread at the next bytecode, inside the section.  So in the main thread the Python
    handlers are swapped for a recorder for the section's length (and the signals that were recorded are raised
    to the real handlers at its end), and the calling thread also blocks the signals (a signal directed at it
    stays pending).  Where signal masks do not exist only the first layer applies; outside the main thread only
    the second (the handlers run in the main thread, never here)."""

    def __enter__(self):
        import signal
        import threading
        self.old = None
        self.saved = None
        self.pending: list = []
        if threading.current_thread() is threading.main_thread():
            saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
            if all(h is not None for h in saved.values()):   # None: a handler set outside Python, left alone
                self.saved = saved
                for s in saved:
                    signal.signal(s, self._record)
        if hasattr(signal, "pthread_sigmask"):
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        return self

    def _record(self, signum, frame):
        self.pending.append(signum)

    def __exit__(self, *exc):
        import signal
        if self.old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)  # a pending signal reaches the recorder here
        if self.saved is not None:
            for s, h in self.saved.items():
                signal.signal(s, h)
            for s in dict.fromkeys(self.pending):
                signal.raise_signal(s)    # now to the handler it was meant for
        return False


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False,
                 error: type[Exception] = SpecError, what: str = "") -> None:
    """Call ``write(f)`` on a temporary file next to ``path``, then rename it over ``path``.

    ``binary`` opens the temporary file in bytes mode (else UTF-8 text with
    ``\\n`` line ends).  A folder that cannot be written raises ``error`` with
    a one-line message naming the file (``what`` describes it, e.g. "plot").
    SIGINT and SIGTERM are held back while the temporary file exists (the write is short: what is
    written was computed before), so a signal never leaves it behind between its creation and the clean-up.
    """
    with signals_deferred():
        _atomic_write(path, write, binary, error, what)


def _atomic_write(path, write, binary, error, what) -> None:
    path = os.fspath(path)
    label = f"{what} {path!r}" if what else repr(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    except OSError as e:
        raise error(f"cannot write {label}: {e.strerror or e}") from None
    try:
        f = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise error(f"cannot write {label}: {e.strerror or e}") from None
        raise


MAX_JSON_BYTES = 256 * 2 ** 20


def require_regular_file(path: str | os.PathLike, what: str, *, error: type[Exception] = SpecError) -> os.stat_result:
    """The one rule for every input file: it exists and is a regular file (a symlink to one is followed).

    A FIFO, a device or a socket is refused before it is opened (opening or reading one can block forever
    or never end); a folder is named as a folder.  Returns the file's ``stat``.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL
        raise error(f"cannot read {what} {path!r}: {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path!r} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path!r} is not a regular file (a device, pipe or socket)")
    return st


def _check_readable(path: str, what: str, error: type[Exception], max_bytes: int | None = MAX_JSON_BYTES) -> None:
    """Refuse what is not a regular file of sensible size (``max_bytes``; None: any size) before opening it
    (a device or pipe could block or never end)."""
    st = require_regular_file(path, what, error=error)
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(f"{what} {path!r} is {st.st_size:,} bytes, more than {max_bytes:,}; not a {what}")


def read_text(path: str | os.PathLike, what: str, *, error: type[Exception] = SpecError,
              max_bytes: int | None = MAX_JSON_BYTES) -> str:
    """A UTF-8 text file of at most ``max_bytes`` (None: any size); a missing, unreadable, non-regular or
    too large file raises ``error`` with one line."""
    path = os.fspath(path)
    _check_readable(path, what, error, max_bytes)
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path!r} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror or e}") from None


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (``json`` would keep the last value silently)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def unique_keys(pairs):
    """``object_pairs_hook`` for ``json.load(s)``: a dict, refusing a key given twice (:class:`DuplicateKey`)."""
    d = {}
    for k, v in pairs:
        if k in d:
            raise DuplicateKey(k)
        d[k] = v
    return d


def duplicate_key_message(label: str, e: DuplicateKey) -> str:
    """The one error line for a key given twice in a JSON object of ``label`` (a file or flag)."""
    from tr_core.errors import short_repr
    return f"{label}: the key {short_repr(e.key)} appears twice in one object (each key once; JSON would keep " \
           "only the last value)"


def loads_strict(text: str, **kw):
    """``json.loads`` refusing duplicate keys (raises :class:`DuplicateKey`, a ``ValueError``)."""
    import json
    return json.loads(text, object_pairs_hook=unique_keys, **kw)


def decode_json(raw: str | bytes, where: str, what: str, *, error: type[Exception] = SpecError,
                loads: Callable[[Any], Any] = loads_strict, at_line: bool = False) -> Any:
    """One JSON value (a line of a file, or a small document) with one error line starting with ``where`` for
    each way it can fail: a key given twice in one object (with the default ``loads``), not UTF-8, not JSON
    (with the column; with ``at_line`` also the line, ``where:LINE``, for a document of several lines), JSON
    nested too deeply for a ``what``, a number too long to read.  The one decoder of JSON lines: routing
    traces, R2R records, prompts files."""
    import json
    from tr_core.errors import short_repr
    try:
        return loads(raw)
    except DuplicateKey as e:
        raise error(f"{where}: the key {short_repr(e.key)} appears twice in one object (each key once)") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not valid UTF-8") from None
    except json.JSONDecodeError as e:
        at = f"{where}:{e.lineno}" if at_line else where
        raise error(f"{at}: not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply for a {what}") from None
    except ValueError as e:  # e.g. an integer with too many digits
        raise error(f"{where}: not a valid {what} ({str(e).splitlines()[0][:80]})") from None


def json_ready(x: Any) -> Any:
    """A plain-JSON copy of ``x`` (for strict JSON output, which has no NaN): dicts (keys as strings), lists
    and tuples copied, NumPy arrays and scalars as Python values, non-finite floats as ``None``; anything else
    as it is.  The one converter of the profiler's and ShadowPrefill's result documents."""
    import math

    import numpy as np

    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_ready(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


def parse_json_text(text: str, label: str, *, error: type[Exception] = SpecError):
    """``json.loads`` with one-line errors naming ``label`` (deep nesting and huge integers included); a key
    given twice in one object is refused."""
    import json
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise error(duplicate_key_message(label, e)) from None
    except json.JSONDecodeError as e:
        raise error(f"{label} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{label} is nested too deeply") from None
    except ValueError as e:
        raise error(f"{label} holds a number that cannot be read: {str(e).split(':')[0]}") from None


def read_json(path: str | os.PathLike, what: str, *, error: type[Exception] = SpecError) -> Any:
    """Load a JSON file; a missing, unreadable or malformed file raises ``error`` with one line naming it.
    A key given twice in one object is refused (``json`` would keep the last value without a word).

    ``what`` names the file's role in the messages, e.g. ``"spec file"`` gives
    ``spec file 'x.json' does not exist``.
    """
    import json

    path = os.fspath(path)
    _check_readable(path, what, error)
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise error(duplicate_key_message(f"{what} {path!r}", e)) from None
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path!r} is a folder, not a file") from None
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {path!r} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{what} {path!r} is nested too deeply to be a {what}") from None
    except MemoryError:
        raise error(f"{what} {path!r} is too large to read") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise error(f"{what} {path!r} holds a number that cannot be read: {str(e).split(':')[0]}") from None
