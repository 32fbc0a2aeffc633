"""The search options: one frozen dataclass that is both the Python keywords and the command-line flags.

:class:`SearchOptions` holds the options of a threshold search that ``tr_model.optimize`` /
``optimize_many``, ``tr_model.tuning.autotune.tune`` / ``on_server_start`` take as keywords and that
``tr-optimize`` and ``tr-autotune run`` take as flags (SGLang's ``ServerArgs`` is the model): every field
carries its flag, its help (units and default in words) and its argparse type in ``metadata``;
:func:`add_search_flags` derives the flags from the fields and :func:`search_options_from_args` turns the
parsed flags back into a validated instance.  Every check of a value, and the rule that ``max_gap`` applies to
the ``certified`` and ``auto`` searches only (:data:`tr_core.search_rule.GAP_SEARCHES`), is made once, in
``__post_init__``.

Errors name the *field* (``max_gap must be a number in [0, 1), got 2``): :class:`FieldError` (bad input,
exit code 2) and :class:`FieldLimit` (a resource limit, exit code 3) keep the message as a template whose
field names a command line renders as its flags (``--max-gap must be ...``) through
:func:`tr_core.cli.fields_as_flags`: the one place a field is mapped to a flag, by structure, never by
rewriting the text.

Foundation: imports the standard library and ``tr_core`` only (no feature, so a ``--help`` stays fast).  The
stationary solvers' names and help come from ``dtmc``, which the foundation cannot import: the command lines
pass them to :func:`add_search_flags` (``solver_choices``, ``solver_help``).
"""

from __future__ import annotations

import dataclasses
import math
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tr_core import search_rule as R
from tr_core.errors import SpecError, WorkTooLarge

__all__ = ["SearchOptions", "FieldError", "FieldLimit", "add_search_flags", "search_options_from_args",
           "SEARCH_FIELDS", "field_flags", "check_fields"]


# ------------------------------------------------------------------------------------------------- errors


class _Field:
    """A field named in a message template."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Template(string.Formatter):
    """``{max_gap}`` is a field (rendered by ``name_of``; ``{search:=}`` reads ``search =`` for the library and
    ``--search`` for a command line); ``{0}``, ``{1}`` are values (``repr`` for the library, plain for a
    command line; a tuple reads ``'a' or 'b'``)."""

    def __init__(self, name_of: Callable[[str], str] | None):
        self.name_of = name_of

    def get_value(self, key, args, kwargs):
        if isinstance(key, int):
            return args[key]
        return _Field(key)

    def format_field(self, value, format_spec):
        if isinstance(value, _Field):
            if self.name_of is None:
                return value.name + (" =" if format_spec == "=" else "")
            return self.name_of(value.name)
        quote = repr if self.name_of is None else str
        if isinstance(value, tuple):
            return " or ".join(quote(v) for v in value)
        if isinstance(value, float) and self.name_of is not None:
            return format(value, "g")
        return quote(value)


class _FieldMessage:
    """A message about fields, kept as a template so that a command line can name its flags instead."""

    template: str = ""
    values: tuple = ()

    def _init_message(self, template: str, values: tuple) -> str:
        self.template, self.values = template, values
        return self.render()

    def render(self, name_of: Callable[[str], str] | None = None) -> str:
        """The message, naming each field by ``name_of(field)`` (the field's own name when None)."""
        return _Template(name_of).vformat(self.template, self.values, {})


class FieldError(_FieldMessage, SpecError):
    """An option value refused (exit code 2); the message names its field(s)."""

    def __init__(self, template: str, *values: Any):
        super().__init__(self._init_message(template, values))


class FieldLimit(_FieldMessage, WorkTooLarge):
    """Work refused by a limit option (exit code 3); the message names the limit's field and the way out."""

    def __init__(self, template: str, *values: Any):
        super().__init__(self._init_message(template, values))


# ----------------------------------------------------------------------------------------------- checks


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _positive_finite(name: str, x) -> None:
    if x is not None and not (_is_num(x) and math.isfinite(x) and x > 0):
        raise FieldError(f"{{{name}}} must be a finite number > 0, got {{0}}", x)


def _int_at_least_1(name: str, x) -> None:
    if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
        raise FieldError(f"{{{name}}} must be an integer >= 1, got {{0}}", x)


def _check_search(x) -> None:
    if x not in R.SEARCHES:
        raise FieldError("{search} must be one of {0}, got {1}", R.SEARCHES, x)


def _check_max_gap(x) -> None:
    if x is not None and not (_is_num(x) and 0 <= x < 1):
        raise FieldError("{max_gap} must be a number in [0, 1), got {0}", x)


def _check_solver(x) -> None:
    if not isinstance(x, str):
        raise FieldError("{solver} must be a solver name, got {0}", x)


# field -> its check of one value (the rules between fields are SearchOptions.__post_init__'s)
_CHECKS: dict[str, Callable[[Any], None]] = {
    "search": _check_search,
    "max_gap": _check_max_gap,
    "solver": _check_solver,
    "tol": lambda x: _positive_finite("tol", x),
    "max_states": lambda x: _int_at_least_1("max_states", x),
    "max_evaluations": lambda x: _int_at_least_1("max_evaluations", x),
    "max_hours": lambda x: _positive_finite("max_hours", x),
}


def check_fields(**values: Any) -> None:
    """Check each given field's value on its own (FieldError naming the field); unknown names are refused."""
    for name, value in values.items():
        if name not in _CHECKS:
            raise TypeError(f"not a search option: {name!r}")
        _CHECKS[name](value)


# ------------------------------------------------------------------------------------------- the options


def _opt(default, flag: str, help: str, *, type=None, metavar=None, choices=None):  # noqa: A002 - argparse's names
    return field(default=default, metadata={"flag": flag, "help": help, "type": type, "metavar": metavar,
                                            "choices": choices})


@dataclass(frozen=True)
class SearchOptions:
    """The options of one threshold search (per N of a sweep or a thresholds table); validated on creation.

    ``None`` means "not given": ``max_gap`` then is :data:`tr_core.search_rule.DEFAULT_MAX_GAP` for the searches
    that take one (:attr:`gap`), ``tol`` the solver's default, ``max_states`` the chain's default limit, and
    ``max_evaluations`` / ``max_hours`` no limit.
    """

    search: str = _opt(R.DEFAULT_SEARCH, "--search", "{search_help}", choices=R.SEARCHES)
    max_gap: float | None = _opt(
        None, "--max-gap", "search certified or auto: the relative gap between B*'s throughput and the proven upper "
        f"bound at which the search stops (default {R.DEFAULT_MAX_GAP:g})", type=float, metavar="G")
    solver: str = _opt("auto", "--solver", "stationary solver: {solver_help}", choices="{solver_choices}")
    tol: float | None = _opt(None, "--tol", "stationary residual tolerance, relative to max(pi) (default {tol})",
                             type=float)
    max_states: int | None = _opt(
        None, "--max-states", "most states of one chain (default {max_states}); a chain above it is refused with exit "
        "code 3 (tr-autotune run: the table stops before the first N whose chain is larger)", type=int, metavar="S")
    max_evaluations: int | None = _opt(
        None, "--max-evaluations", "refuse a search that would solve more chains (or run more simulations) than "
        "this, counted before any work where it can be (a sweep's exhaustive part; each N otherwise) (default "
        "{max_evaluations}; exit code 3)", type=int, metavar="K")
    max_hours: float | None = _opt(
        None, "--max-hours", "refuse work whose time, estimated before any work from the rates measured for two "
        "models (one core), is above this many hours (default {max_hours}; exit code 3; tr-optimize's simulated "
        "search counts --sim-budget-s per N; tr-autotune run: not with --time-budget-s in the foreground)",
        type=float, metavar="H")

    def __post_init__(self):
        check_fields(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if self.max_gap is not None and self.search not in R.GAP_SEARCHES:
            raise FieldError("{max_gap} applies to {search:=} {0}, not {1}", R.GAP_SEARCHES, self.search)

    @property
    def gap(self) -> float | None:
        """The gap the search runs with: ``max_gap``, its default for the searches that take one, else None."""
        if self.search not in R.GAP_SEARCHES:
            return None
        return R.DEFAULT_MAX_GAP if self.max_gap is None else float(self.max_gap)

    def given(self) -> dict:
        """The fields that differ from their defaults (the keywords a caller set), as a dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}

    def replace(self, **changes) -> "SearchOptions":
        return dataclasses.replace(self, **changes)


SEARCH_FIELDS = tuple(f.name for f in dataclasses.fields(SearchOptions))


def field_flags() -> dict[str, str]:
    """field -> its flag (``{"max_gap": "--max-gap", ...}``)."""
    return {f.name: f.metadata["flag"] for f in dataclasses.fields(SearchOptions)}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _default_words(name: str, value) -> str:
    if value is not None:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{value:g}" \
            if isinstance(value, float) else str(value)
    return {"tol": "the solver's", "max_states": "the chain's limit", "max_evaluations": "no limit",
            "max_hours": "no limit"}.get(name, "none")


def add_search_flags(group, *, defaults: Mapping[str, Any] | None = None, words: Mapping[str, str] | None = None,
                     solver_choices=(), solver_help: str = "", fields=SEARCH_FIELDS) -> None:
    """Add one flag per field of :class:`SearchOptions` (``fields``: a subset) to an argparse group.

    ``defaults``: a command's own defaults (``tr-optimize``'s ``--max-evaluations 1000000``), checked like a
    value; the help says each default (``words``: a default in words instead, e.g. what ``None`` means
    there).  ``solver_choices``, ``solver_help``: ``dtmc.SOLVERS`` and
    ``dtmc.solver_help()``, from the caller (the foundation does not import dtmc).
    """
    defaults = dict(defaults or {})
    unknown = set(defaults) - set(fields)
    if unknown:
        raise TypeError(f"defaults for fields not added: {sorted(unknown)}")
    check_fields(**{k: v for k, v in defaults.items() if k in _CHECKS})
    by_name = {f.name: f for f in dataclasses.fields(SearchOptions)}
    words = {**{name: _default_words(name, defaults.get(name, by_name[name].default)) for name in fields},
             **(words or {})}
    context = {**words, "search_help": R.search_help(defaults.get("search", R.DEFAULT_SEARCH)),
               "solver_help": solver_help}
    for name in fields:
        f = by_name[name]
        md = f.metadata
        kw: dict = {"default": defaults.get(name, f.default), "help": md["help"].format(**context)}
        if md["type"] is not None:
            kw["type"] = md["type"]
        if md["metavar"] is not None:
            kw["metavar"] = md["metavar"]
        if md["choices"] == "{solver_choices}":
            kw["choices"] = tuple(solver_choices)
        elif md["choices"] is not None:
            kw["choices"] = md["choices"]
        group.add_argument(md["flag"], dest=name, **kw)


def search_options_from_args(args, *, fields=SEARCH_FIELDS, defaults: Mapping[str, Any] | None = None,
                             **overrides) -> SearchOptions:
    """The :class:`SearchOptions` of parsed flags (added by :func:`add_search_flags`); a refused value raises
    :class:`FieldError` naming the flag the user typed (``--max-gap must be ...``).

    ``max_gap`` counts as given only when typed (or different from the command's default): a default gap is
    never refused for a search that takes none.  ``overrides``: fields the command fixes itself.
    """
    from tr_core.cli import fields_as_flags, given

    defaults = dict(defaults or {})
    values = {name: getattr(args, name) for name in fields}
    if "max_gap" in values and not given(args, "max_gap") and values["max_gap"] == defaults.get("max_gap"):
        values["max_gap"] = None   # the command's default gap, not typed: not a gap the user asked for
    values.update(overrides)
    with fields_as_flags(args, {name: name for name in fields}):
        return SearchOptions(**values)
