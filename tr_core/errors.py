"""Exceptions of the public API.

Every error a user can cause is a subclass of :class:`TRError`; the CLIs turn
them into one ``error:`` line on stderr and an exit code (``exit_code``).
"""

from __future__ import annotations

from typing import Any

# characters of a value quoted in an error message
SHORT_MAX = 160


def short_repr(x: Any, *, maxlevel: int = 3, maxlist: int = 8) -> str:
    """A bounded repr of a (possibly huge or deeply nested) value, for one-line error messages.

    reprlib bounds each level and each string, not their sum (long keys at every level add up), so
    the result is also cut at ``SHORT_MAX`` characters.
    """
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict = maxlevel, maxlist, 4
    r.maxstring = r.maxother = r.maxlong = 40
    try:
        text = r.repr(x)
    except Exception:  # noqa: BLE001 - a message must never turn into a second error
        return f"<{type(x).__name__}>"
    return text if len(text) <= SHORT_MAX else text[:SHORT_MAX - 3] + "..."


class TRError(Exception):
    """Base class of the errors the tools report to users (exit code 2)."""

    exit_code = 2


class SpecError(TRError, ValueError):
    """A system spec, threshold vector or option is invalid; the message names the field."""


class StateSpaceTooLarge(TRError):
    """The reachable state space would exceed the allowed number of states (exit code 3)."""

    exit_code = 3


class SolverFailed(TRError):
    """A valid chain whose stationary solve did not converge or hit a solver limit (exit code 3).

    Not bad input: the message says what to do (another ``--solver``, a looser ``--tol``, a coarser grid).
    """

    exit_code = 3


class WorkTooLarge(TRError):
    """Work refused before it starts because its size (counted up front) exceeds a limit (exit code 3)."""

    exit_code = 3
