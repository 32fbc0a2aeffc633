"""Errors of :mod:`shadow_prefill` that a user can cause.

They subclass :class:`tr_core.errors.TRError`, so ``tr-shadow`` (like the
project's other CLIs) turns them into one ``error: ...`` line on stderr and
exit code 2.  Messages about an input file name the file and, for line-based
formats, the 1-based line number (``trace.jsonl:17: ...``).
"""

from __future__ import annotations

from tr_core.errors import TRError

__all__ = ["ShadowError", "InputFileError", "ShadowResourceLimit"]


class ShadowError(TRError, ValueError):
    """An invalid option, parameter or value (exit code 2)."""


class InputFileError(ShadowError):
    """A malformed or unreadable input file; the message names the file and line."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")


class ShadowResourceLimit(TRError):
    """A run refused because it would exceed a size limit (exit code 3); the message gives the count and the flag."""

    exit_code = 3
