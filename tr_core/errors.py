"""Exceptions of the public API.

Every error a user can cause is a subclass of :class:`TRError`; the CLIs turn
them into one ``error:`` line on stderr and an exit code (``exit_code``).
"""

from __future__ import annotations


class TRError(Exception):
    """Base class of the errors the tools report to users (exit code 2)."""

    exit_code = 2


class SpecError(TRError, ValueError):
    """A system spec, threshold vector or option is invalid; the message names the field."""


class StateSpaceTooLarge(TRError):
    """The reachable state space would exceed the allowed number of states (exit code 3)."""

    exit_code = 3
