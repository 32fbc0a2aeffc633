"""Atomic file writes shared by every tool of the project.

A file is written to a temporary name in its destination folder, flushed and
fsync'ed, given ordinary permissions (``0666`` less the umask, as ``open``
would), and renamed over the destination in one step.  Readers therefore see
the old file or the new one, never a half-written one, and on any failure the
temporary file is removed and the old file stays as it was.
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Any, Callable

from tr_core.errors import SpecError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False,
                 error: type[Exception] = SpecError, what: str = "") -> None:
    """Call ``write(f)`` on a temporary file next to ``path``, then rename it over ``path``.

    ``binary`` opens the temporary file in bytes mode (else UTF-8 text with
    ``\\n`` line ends).  A folder that cannot be written raises ``error`` with
    a one-line message naming the file (``what`` describes it, e.g. "plot").
    """
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


def read_json(path: str | os.PathLike, what: str, *, error: type[Exception] = SpecError) -> Any:
    """Load a JSON file; a missing, unreadable or malformed file raises ``error`` with one line naming it.

    ``what`` names the file's role in the messages, e.g. ``"spec file"`` gives
    ``spec file 'x.json' does not exist``.
    """
    import json

    path = os.fspath(path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {path!r} is not valid JSON: {e}") from None
