"""Shared command-line plumbing: the one CLI convention (docs/cli-convention.md) in code.

Every command builds its parser with :class:`Parser` and runs through :func:`run_cli`, so that

- bad input (argparse's own errors included, in sub-commands too) is one ``error:`` line on stderr, exit 2;
- a refused resource limit is exit 3 (:class:`tr_core.errors.TRError` subclasses carry ``exit_code``);
- Ctrl-C is ``error: interrupted``, exit 130, also when the interrupt surfaces inside a compiled kernel
  (numba re-raises it as ``SystemError: CPUDispatcher(...) returned a result with an exception set``);
- ``--out FILE`` writes what would go to stdout to FILE instead, atomically, and only to a regular file;
- lists are space-separated (a comma list is still read, with a deprecation note); integer lists take
  ranges ``A-B`` that are never expanded into memory (:class:`IntRanges`);
- a long flag is spelled in full: an abbreviation (``--thresh`` for ``--thresholds``) is refused as an
  unknown argument, so no old or partial spelling parses by accident.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import os
import signal
import stat
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence

from tr_core.errors import SpecError, TRError

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_RESOURCE = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM

FORMATS = ("table", "json", "csv")


def _one_line(message: str) -> str:
    lines = [s.strip() for s in str(message).splitlines() if s.strip()]
    return lines[0] if lines else ""


class _Notes:
    """Where :func:`note` writes: held while a command line is parsed, silenced by that line's ``--quiet``."""

    held: list | None = None  # notes made while a command line is parsed, written once --quiet is known
    argv: Sequence[str] = ()  # that command line
    running = False           # inside run_cli: the parsed --quiet holds for the whole command
    quiet = False             # the command run_cli is running was given --quiet


def note(message: str) -> None:
    """A ``note:`` line on stderr (deprecations, choices made for the user); none under ``--quiet``.

    Inside :func:`run_cli`, a command line parsed with ``--quiet`` silences every note of that command; a note
    made while the command line is parsed (a comma list) waits until the parse tells whether ``--quiet`` is there.
    """
    if _Notes.held is not None:
        _Notes.held.append(message)
        return
    if not _Notes.quiet:
        sys.stderr.write(f"note: {message}\n")


def _release_notes(quiet: bool) -> None:
    held, _Notes.held = _Notes.held, None
    if not quiet:
        for message in held or ():
            sys.stderr.write(f"note: {message}\n")


class Parser(argparse.ArgumentParser):
    """argparse with the project's error convention: one ``error:`` line on stderr, exit 2.

    Sub-parsers made with ``add_subparsers().add_parser`` are of the same class, so their errors follow
    the convention too; no usage block is printed.  Long flags are never abbreviated (``allow_abbrev`` is
    off): ``--thresh`` is an unknown argument, not ``--thresholds``.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        _release_notes("--quiet" in _Notes.argv)  # the notes of the flags read before the bad one come first
        sys.stderr.write(f"error: {_one_line(message)}\n")
        raise SystemExit(EXIT_BAD_INPUT)

    def parse_args(self, args=None, namespace=None):
        if _Notes.held is not None:  # a parse inside a parse: the outer one holds the notes
            return super().parse_args(args, namespace)
        _Notes.argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        _Notes.held = []
        try:
            ns = super().parse_args(args, namespace)
        except BaseException:
            _Notes.held = None  # --help, --version: what was held goes with them (errors wrote it already)
            raise
        quiet = bool(getattr(ns, "quiet", False))
        if _Notes.running:
            _Notes.quiet = quiet
        _release_notes(quiet)
        return ns

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        mine = self._typed_flags(argv)  # before parsing: an argparse error names the spelling typed too
        ns, extras = super().parse_known_args(argv, namespace)
        # which flags the user typed (a sub-command's were recorded by its own parser and copied here)
        typed = dict(getattr(ns, TYPED_ATTR, None) or {})
        for dest, name in mine.items():
            typed.setdefault(dest, name)
        setattr(ns, TYPED_ATTR, typed)
        if getattr(ns, "_formats", None) is not None and getattr(ns, "out", None) is not None:  # "" too
            check_out_path(ns.out, flag_name(ns, "out", "--out"))  # --out is checked before any work, everywhere
        return ns, extras

    def _typed_flags(self, argv) -> dict:
        """dest -> the option string the user typed for it."""
        out: dict = {}
        for tok in argv:
            if tok == "--":
                break
            if not isinstance(tok, str) or not tok.startswith("-") or tok == "-":
                continue
            name = tok.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is not None and action.dest != argparse.SUPPRESS:
                out.setdefault(action.dest, name)
        return out


TYPED_ATTR = "_typed_flags"


def given(args, dest: str) -> str | None:
    """The flag the user typed for ``dest`` (``"--jitter"``), or None when the value is the default.

    Namespaces made by :class:`Parser` know; any other object (a test's ``SimpleNamespace``) says None.
    """
    return (getattr(args, TYPED_ATTR, None) or {}).get(dest)


def flag_name(args, dest: str, default: str) -> str:
    """The flag to name in a message about ``dest``: the one the user typed, else ``default``."""
    return given(args, dest) or default


def refuse_given(args, dests: Sequence[str], reason: str) -> None:
    """Refuse (SpecError) the first of ``dests`` the user typed: its value would be silently dropped.

    ``reason`` completes the sentence ``error: --jitter <reason>``, e.g. ``"applies to --method simulate
    or auto, not exact"``.  Conflicting flags are refused, never silently dropped (docs/cli-convention.md).
    """
    for dest in dests:
        flag = given(args, dest)
        if flag:
            raise SpecError(f"{flag} {reason}")


def fields_as_flags(args, fields: dict):
    """Context manager: a library error that names its fields is re-raised naming the flags the user typed for
    them, same type: the one place a field is mapped to a flag.

    ``fields`` maps a library field to the parser dest that carries it (``{"max_gap": "max_gap"}``).  An error
    that keeps its message as a template (:class:`tr_core.search_options.FieldError`, ``FieldLimit``) is
    rendered with every field it names as a flag (``--max-gap applies to --search certified or auto``); any
    other error that starts with a field name (``max_gap must be in [0, 1)``) gets that one field's flag.
    """
    import contextlib

    def flag_of(name: str) -> str:
        dest = fields.get(name)
        return name if dest is None else flag_name(args, dest, "--" + dest.replace("_", "-"))

    @contextlib.contextmanager
    def _ctx():
        try:
            yield
        except TRError as e:
            render = getattr(e, "render", None)
            if callable(render) and getattr(e, "template", None):
                e.args = (render(flag_of),) + tuple(e.args[1:])
                raise
            msg = str(e)
            for field_name in fields:
                if msg.startswith(field_name) and msg[len(field_name):len(field_name) + 1] in (" ", "[", ":", "="):
                    e.args = (flag_of(field_name) + msg[len(field_name):],) + tuple(e.args[1:])
                    break
            raise
    return _ctx()


def fail(message: str, code: int = EXIT_BAD_INPUT):
    sys.stderr.write(f"error: {_one_line(message)}\n")
    raise SystemExit(code)


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints ``<prog> <version>`` and exits 0."""
    from tr_core.version import __version__
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


# --------------------------------------------------------------------------------------------- interrupts


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend((e.__cause__, e.__context__))


def is_interrupt(exc: BaseException) -> bool:
    """True when ``exc`` is, or was raised while handling, a KeyboardInterrupt.

    numba's dispatcher turns an interrupt that arrives while a compiled function runs into
    ``SystemError: CPUDispatcher(...) returned a result with an exception set`` whose context is the
    KeyboardInterrupt; worker pools may wrap it too.
    """
    return any(isinstance(e, KeyboardInterrupt) for e in _chain(exc))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean-up runs (temporary files removed, workers ended)."""


def _on_sigterm(signum, frame):
    if os.getpid() != _SIGTERM_OWNER[0]:  # a forked child: die as the signal would have made it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


_SIGTERM_OWNER = [0]


def _install_sigterm() -> Callable[[], None]:
    """SIGTERM -> :class:`Terminated` in this process (main thread only); returns the restorer."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        old = signal.getsignal(signal.SIGTERM)
        if old not in (signal.SIG_DFL, None):  # an embedding program chose its own handling: keep it
            return lambda: None
        _SIGTERM_OWNER[0] = os.getpid()
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):
        return lambda: None
    old_hook = sys.unraisablehook
    sys.unraisablehook = _redeliver_swallowed(old_hook)

    def restore():
        signal.signal(signal.SIGTERM, old)
        sys.unraisablehook = old_hook
    return restore


def _redeliver_swallowed(old_hook):
    """An unraisable-exception hook that sends a swallowed interrupt again.  A signal handler's exception
    raised while Python code runs inside a C callback (llvmlite's object-cache callback while numba compiles,
    for one) cannot propagate: Python reports it as unraisable and the command would run on, ignoring the
    signal.  Sending the signal again delivers it at the next point where it can propagate."""
    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt) and os.getpid() == _SIGTERM_OWNER[0]:
            import threading
            # from another thread, a moment later: sent from here, the handler would run (and be swallowed)
            # inside this hook again
            again = threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGTERM if isinstance(exc, Terminated)
                                                     else signal.SIGINT))
            again.daemon = True
            again.start()
            return
        old_hook(unraisable)
    return hook


def _memory_error(exc: BaseException) -> bool:
    return any(isinstance(e, MemoryError) for e in _chain(exc))


def run_cli(fn: Callable, argv=None, *, keep_heap: bool = False) -> int:
    """Run ``fn(argv)`` under the error contract: 0 ok, 2 bad input, 3 resource limit, 130 interrupted,
    143 terminated (SIGTERM cleans up as Ctrl-C does).

    ``keep_heap``: a command that solves large chains keeps freed memory for its next solve
    (:func:`tr_core.heap.keep_heap`); only when run as a console script (``argv`` None), never inside a
    program that calls it with its own arguments."""
    if keep_heap and argv is None:
        from tr_core.heap import keep_heap as _keep

        _keep()
    restore = _install_sigterm()
    before = _Notes.running, _Notes.quiet
    _Notes.running, _Notes.quiet = True, False
    try:
        return _run_cli(fn, argv)
    finally:
        _Notes.running, _Notes.quiet = before
        restore()


def _run_cli(fn: Callable, argv=None) -> int:
    try:
        return int(fn(argv) or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt as e:
        _interrupted(e)
    except TRError as e:
        if is_interrupt(e):
            _interrupted(e)
        fail(_one_line(str(e)) or type(e).__name__, e.exit_code)
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except MemoryError:
        _out_of_memory()
    except (ValueError, OSError) as e:
        if is_interrupt(e):
            _interrupted(e)
        if _memory_error(e):
            _out_of_memory()
        fail(_one_line(str(e)) or type(e).__name__, EXIT_BAD_INPUT)
    except BaseException as e:
        if is_interrupt(e):
            _interrupted(e)
        if _memory_error(e):  # wrapped by a pool or a compiled kernel
            _out_of_memory()
        raise
    return 0


def _out_of_memory():
    fail("out of memory; ask for a smaller problem (fewer N, a coarser --delta-ms, a lower --max-states)",
         EXIT_RESOURCE)


def _interrupted(exc: BaseException | None = None):
    try:
        sys.stdout.flush()
    except Exception:  # stdout may be a closed pipe; the exit code says enough
        pass
    terminated = exc is not None and any(isinstance(e, Terminated) for e in _chain(exc))
    sys.stderr.write(("\n" if Progress.line_open else "") + ("error: terminated\n" if terminated
                                                             else "error: interrupted\n"))
    raise SystemExit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def _quiet_broken_pipe():
    # the reader went away (``| head``): point stdout at /dev/null so the final flush does not fail again
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# ------------------------------------------------------------------------------------------------- lists


class IntRanges(Sequence[int]):
    """Sorted unique integers kept as disjoint closed ranges: ``--N 1-1000000000`` costs two numbers.

    Behaves as a read-only sequence (``len``, indexing, ``in``, iteration in increasing order); ``count``
    is ``len``.  Comparing with a list compares the integers.
    """

    def __init__(self, spans: Iterable[tuple[int, int]] = ()):
        merged: list[list[int]] = []
        for a, b in sorted((int(a), int(b)) for a, b in spans):
            if b < a:
                continue
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.spans: tuple[tuple[int, int], ...] = tuple((a, b) for a, b in merged)
        self._starts = [0]
        for a, b in self.spans:
            self._starts.append(self._starts[-1] + b - a + 1)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("IntRanges index out of range")
        k = bisect.bisect_right(self._starts, i) - 1
        return self.spans[k][0] + (i - self._starts[k])

    def __iter__(self) -> Iterator[int]:
        for a, b in self.spans:
            yield from range(a, b + 1)

    def __contains__(self, x) -> bool:
        return any(a <= x <= b for a, b in self.spans)

    def __eq__(self, other) -> bool:
        if isinstance(other, IntRanges):
            return self.spans == other.spans
        if isinstance(other, (list, tuple, range)):
            return len(other) == len(self) and all(x == y for x, y in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return "IntRanges(" + " ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.spans) + ")"

    @property
    def min(self) -> int:
        return self.spans[0][0]

    @property
    def max(self) -> int:
        return self.spans[-1][1]


def _split_commas(values: Sequence[str], flag: str) -> list[str]:
    out: list[str] = []
    warned = False
    for v in values:
        parts = str(v).split(",")
        if len(parts) > 1 and not warned:
            note(f"comma-separated lists for {flag} are deprecated; separate the values with spaces")
            warned = True
        out.extend(p.strip() for p in parts if p.strip())
    return out


def _parse_one_int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{flag}: {text!r} is not an integer or a range like 1-16") from None


def parse_int_ranges(values: Sequence[str], flag: str, lo: int | None = 1, hi: int | None = None) -> IntRanges:
    """``["1", "4-8", "16"]`` -> :class:`IntRanges` (lazily; a range is never expanded).

    A comma list (``1,2,4``) is still read, with a deprecation note.  An empty range (``8-4``) is refused
    and named as empty; values below ``lo`` or above ``hi`` are refused.
    """
    spans = []
    for part in _split_commas(values, flag):
        body = part[1:]
        if "-" in body:
            cut = 1 + body.index("-")
            a, b = _parse_one_int(part[:cut], flag), _parse_one_int(part[cut + 1:], flag)
            if b < a:
                raise SpecError(f"{flag}: the range {part!r} is empty (it ends before it starts)")
        else:
            a = b = _parse_one_int(part, flag)
        if lo is not None and a < lo:
            raise SpecError(f"{flag} must be >= {lo}, got {a}")
        if hi is not None and b > hi:
            raise SpecError(f"{flag} must be <= {hi}, got {b}")
        spans.append((a, b))
    if not spans:
        raise SpecError(f"{flag}: no values given")
    return IntRanges(spans)


def parse_int_list(values: Sequence[str], flag: str, lo: int = 1) -> IntRanges:
    """Sorted unique integers from values and ranges (see :func:`parse_int_ranges`); lazy."""
    return parse_int_ranges(values, flag, lo=lo)


def parse_list(values: Sequence[str], flag: str, convert: Callable = float, what: str = "a number") -> list:
    """Space-separated values (a comma list still read, with a deprecation note), each through ``convert``."""
    out = []
    for part in _split_commas(values, flag):
        try:
            out.append(convert(part))
        except (TypeError, ValueError):
            raise SpecError(f"{flag}: {part!r} is not {what}") from None
    if not out:
        raise SpecError(f"{flag}: no values given")
    return out


class ListAction(argparse.Action):
    """``nargs='+'`` list flag that also reads a deprecated comma list; converts with ``type``.

    Use through :func:`add_list_arg`.
    """

    def __init__(self, option_strings, dest, convert=str, what="a value", **kw):
        kw.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kw)
        self.convert = convert
        self.what = what

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            vals = parse_list(values, option_string or self.dest, self.convert, self.what)
        except SpecError as e:
            parser.error(str(e))
        setattr(namespace, self.dest, vals)


def add_list_arg(group, *flags: str, convert: Callable = float, what: str = "a number", **kw):
    """Add a space-separated list flag (comma lists read with a deprecation note)."""
    return group.add_argument(*flags, action=ListAction, convert=convert, what=what, **kw)


def finite_float(text: str) -> float:
    """argparse ``type``: a finite float (``nan``/``inf`` refused)."""
    import math
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(text)
    return x


def check_number(value, flag: str, *, ge=None, gt=None, le=None, lt=None, unit: str = ""):
    """The one check of a numeric flag's value (None passes: not given): finite, and within the bounds
    given (``ge`` >=, ``gt`` >, ``le`` <=, ``lt`` <); else ``SpecError("--flag must be > 0 seconds, got 0")``.
    Returns the value."""
    import math
    if value is None:
        return value
    bounds = [(op, b) for op, b in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if b is not None]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and all(
        {">=": value >= b, ">": value > b, "<=": value <= b, "<": value < b}[op] for op, b in bounds)
    if not ok:
        if len(bounds) == 2 and bounds[0][0].startswith(">") and bounds[1][0].startswith("<"):
            (o1, b1), (o2, b2) = bounds
            rule = f"in {'[' if o1 == '>=' else '('}{b1:g}, {b2:g}{']' if o2 == '<=' else ')'}"
        else:
            rule = " and ".join(f"{op} {b:g}" for op, b in bounds) or "finite"
        got = f"{value:g}" if isinstance(value, float) else repr(value) if not isinstance(value, int) else str(value)
        raise SpecError(f"{flag} must be {rule}{unit}, got {got}")
    return value


def parse_int_or_word(text, flag: str, words: Sequence[str], *, ge: int = 1):
    """A flag value that is an integer >= ``ge`` or one of ``words`` (``auto``, ``none``; the message names the
    first): the word (lower case) or the integer; else ``SpecError`` naming the flag."""
    if str(text).lower() in words:
        return str(text).lower()
    try:
        k = int(text)
    except (TypeError, ValueError):
        raise SpecError(f"{flag} must be an integer >= {ge} or {words[0]!r}, got {text!r}") from None
    return check_number(k, flag, ge=ge)


# ----------------------------------------------------------------------------------------------- output


def require_subcommand(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The subcommand ``args`` names; without one, the one wording every command uses for it (exit 2)."""
    act = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = getattr(args, act.dest, None)
    if command is None:
        names = list(act.choices)
        listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        parser.error(f"a subcommand is required: {listed} (see {parser.prog} --help)")
    return command


def add_subcommands(sub, table) -> dict:
    """Add every subcommand of ``table`` to the subparsers ``sub``: ``name: (help, description, add_arguments)``,
    or ``(help, description, add_arguments, handler)``, whose handler becomes the parsed arguments' ``func``.
    A command's subcommands in one table: their one-line helps side by side, and every parser made one way.
    Returns the parsers by name."""
    parsers = {}
    for name, (help_, description, add_arguments, *handler) in table.items():
        p = parsers[name] = sub.add_parser(name, help=help_, description=description)
        add_arguments(p)
        if handler:
            p.set_defaults(func=handler[0])
    return parsers


QUIET_HELP = "no progress bar and no notes on stderr (warnings, errors and the results still appear)"


def add_quiet_arg(group) -> None:
    """``--quiet``, with the one meaning it has in every command (docs/cli-convention.md)."""
    group.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def add_window_args(group, duration_s: float, warmup_s: float, per: str = "") -> None:
    """``--duration-s`` and ``--warmup-s`` of a closed-loop measurement (``tr-autotune measure``, ``tr-profile
    serve-bench``): the measured window and the warm-up before it, wall-clock seconds; ``per`` (``" per N"``)
    when every concurrency gets a window of its own."""
    group.add_argument("--duration-s", type=float, default=duration_s, metavar="S",
                       help=f"measured window{per}, wall-clock seconds (default {duration_s:g})")
    group.add_argument("--warmup-s", type=float, default=warmup_s, metavar="S",
                       help=f"warm-up{per} before the window, wall-clock seconds (default {warmup_s:g})")


def add_output_args(parser, formats: Sequence[str] = FORMATS, *, default: str = "table", group=None) -> None:
    """``--format`` and ``--out FILE`` with the convention's meaning; resolve with :func:`output_format`."""
    g = group or parser
    g.add_argument("--format", choices=tuple(formats), default=None,
                   help=f"output format (default {default}; with --out, the file's extension when it names one)")
    g.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout (atomically: a "
                   "temporary name, then a rename; only a regular file)")
    parser.set_defaults(_format_default=default, _formats=tuple(formats))


def output_format(args, default: str | None = None) -> str:
    """The chosen format: ``--format``, else the ``--out`` file's extension when it is a format, else the default."""
    fmt = getattr(args, "format", None)
    if fmt:
        return fmt
    formats = getattr(args, "_formats", FORMATS)
    out = getattr(args, "out", None)
    if out:
        ext = os.path.splitext(out)[1].lower().lstrip(".")
        if ext in formats and ext != "table":
            return ext
    return default or getattr(args, "_format_default", "table")


def check_out_path(path: str, flag: str = "--out") -> str:
    """Refuse an output target that is not (or would not be) a regular file; return the path to rename onto.

    A device, a symlink to one, a folder or a FIFO is refused (replacing ``/dev/full`` by a file as root is
    the failure this prevents); a missing folder is refused before any work.  A symlink to a regular file
    is followed, so the file it points to is replaced.
    """
    if not path:
        raise SpecError(f"{flag}: empty file name")
    if path.endswith(os.sep):
        raise SpecError(f"{flag} {path!r} names a folder, not a file")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise SpecError(f"{flag} {path!r}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise SpecError(f"{flag} {path!r} is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{flag} {path!r} is not a regular file (a device, pipe or socket); "
                            "give a file name")
    folder = os.path.dirname(real) or "."
    if not os.path.isdir(folder):
        raise SpecError(f"cannot write {flag} {path!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"cannot write {flag} {path!r}: the folder {folder!r} is not writable")
    return real


def emit(text: str, out: str | None = None, flag: str = "--out") -> None:
    """Write ``text`` to stdout, or atomically to the regular file ``out`` instead."""
    if not out:
        sys.stdout.write(text)
        return
    from tr_core.fileio import atomic_write
    real = check_out_path(out, flag)
    atomic_write(real, lambda f: f.write(text), what=f"{flag} file")


def format_gain(x: float | None) -> str:
    """A gain or ratio as printed in tables: ``1.111x`` (``-`` when unknown)."""
    return "-" if x is None else f"{x:.3f}x"


# ------------------------------------------------------------------------------------------ progress, tables


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal and when not quiet."""

    line_open = False  # a bar is drawn without its newline (an interrupt message starts a new line)

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
        Progress.line_open = done < total
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
