"""The session-trace JSONL format: read (streaming, line-checked) and write (atomically).

One JSON object per line, one line per LLM call (schema:
``data/schemas/session-trace.schema.json``)::

    {"session": "s17", "step": 0, "model": "qwen2.5-7b-instruct", "prompt_tokens": 812,
     "new_input_tokens": 812, "output_tokens": 240, "gap_s": 0.0, "append_only": true,
     "task": "coding", "score": 1.0}

Required: ``session`` (string or integer), ``step`` (integer >= 0; a session's
steps increase by 1), ``model`` (non-empty string), ``prompt_tokens`` (>= 1),
``new_input_tokens`` (0..prompt_tokens), ``output_tokens`` (>= 0), ``gap_s``
(seconds >= 0 between the previous call's completion - or the session's
start - and this call) and ``append_only`` (boolean).  Optional: ``task``
(string or integer; the same on every line of a session) and ``score``
(number or null: the routed model's correctness on this call).  Other keys are
ignored.  Blank lines are skipped.  Sessions may interleave (a trace sorted by
time), but each session's lines come in step order.  The chain rules of
:mod:`shadow_prefill.sessions` apply: a first call has ``new_input_tokens ==
prompt_tokens``; later calls share ``prompt_tokens - new_input_tokens`` tokens
with the previous call's prompt + output, exactly all of them when
``append_only`` is true.

Every violation raises :class:`~shadow_prefill.errors.InputFileError` naming
the file, line and field; the CLI prints it as ``error: FILE:LINE: ...`` (exit 2).
Each field is checked for its JSON type (a string where a number belongs is
refused, never converted), finiteness and range: token counts and steps are at
most :data:`MAX_TOKENS`, ``gap_s`` at most :data:`MAX_GAP_S`, so sums over a
trace stay exact in int64/float64.  A file ending in ``.gz`` (or starting with
gzip's magic bytes) is read decompressed; one cut short is reported in one line.

The checks are :mod:`shadow_prefill.inputs`'s, shared by every ShadowPrefill
reader.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Iterator, TextIO

import numpy as np

from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.inputs import STREAM_ERRORS, MAX_TOKENS, short_repr, stream_error, check_float, check_int, \
    open_input, parse_json_value
from shadow_prefill.sessions import SessionSet, check_call_chain

__all__ = ["iter_session_trace", "read_session_trace", "write_session_trace", "format_session_trace", "atomic_write",
           "TRACE_FIELDS", "MAX_TOKENS", "MAX_GAP_S"]

MAX_GAP_S = 1e9  # seconds (~32 years): larger gaps are a unit mistake and would swamp float64 clocks

TRACE_FIELDS = ("session", "step", "model", "prompt_tokens", "new_input_tokens", "output_tokens", "gap_s",
                "append_only")


def atomic_write(path: str | os.PathLike, write: Callable[[TextIO], None]) -> None:
    """Call ``write(f)`` on a temp file next to ``path``, then rename it over ``path``.

    On any error the temp file is removed and ``path`` is left as it was
    (the project's shared :func:`tr_core.fileio.atomic_write`, raising ShadowError).
    """
    from tr_core.fileio import atomic_write as _atomic_write

    _atomic_write(path, write, error=ShadowError)


def _int(rec: dict, key: str, minimum: int, fail) -> int:
    if key not in rec:
        fail(f"missing field {key!r}")
    return check_int(rec[key], key, fail, lo=minimum)


def iter_session_trace(path: str | os.PathLike) -> Iterator[dict]:
    """Yield each call of a session trace as a checked, normalised record (constant memory per open session).

    Records have exactly the keys of the format (``task`` ``""`` and ``score``
    ``None`` when absent) plus ``line`` (1-based).
    """
    path = os.fspath(path)
    # per open session: (next step, previous prompt, previous output, task)
    state: dict[str, tuple[int, int, int, str]] = {}
    f = open_input(path)
    with f:
        lineno = 0
        while True:
            try:
                line = f.readline()
            except (OSError, UnicodeDecodeError, MemoryError, *STREAM_ERRORS) as e:
                raise stream_error(path, e, lineno + 1) from None
            if not line:
                break
            lineno += 1
            if not line.strip():
                continue

            def fail(msg: str, _n=lineno):
                raise InputFileError(path, msg, _n)

            rec = parse_json_value(line, path, lineno)
            if not isinstance(rec, dict):
                fail(f"each line must be a JSON object (one call), got {type(rec).__name__}")
            sid = rec.get("session")
            if sid is None:
                fail("missing field 'session'")
            if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
                fail(f"field 'session' must be a non-empty string or an integer, got {short_repr(sid)}")
            sid = str(sid)
            step = _int(rec, "step", 0, fail)
            model = rec.get("model")
            if not isinstance(model, str) or not model:
                fail("field 'model' must be a non-empty string" if "model" in rec else "missing field 'model'")
            prompt = _int(rec, "prompt_tokens", 1, fail)
            new_in = _int(rec, "new_input_tokens", 0, fail)
            out = _int(rec, "output_tokens", 0, fail)
            if "gap_s" not in rec:
                fail("missing field 'gap_s'")
            gap = check_float(rec["gap_s"], "gap_s", fail, lo=0.0, hi=MAX_GAP_S, unit=" (seconds)")
            if "append_only" not in rec:
                fail("missing field 'append_only'")
            app = rec["append_only"]
            if not isinstance(app, bool):
                fail(f"field 'append_only' must be true or false, got {short_repr(app)}")
            task = rec.get("task", "")
            if task is None:
                task = ""
            if isinstance(task, bool) or not isinstance(task, (str, int)):
                fail(f"field 'task' must be a string or an integer, got {short_repr(task)}")
            task = str(task)
            score = rec.get("score")
            if score is not None:
                score = check_float(score, "score", fail, lo=-math.inf)
            st = state.get(sid)
            if st is None:
                prev_p = prev_o = None
            else:
                nxt, prev_p, prev_o, t0 = st
                if step != nxt:
                    fail(f"session {short_repr(sid)}: expected step {nxt} after step {nxt - 1}, got {step} "
                         f"(each session's lines must come in step order)")
                if "task" in rec and task != t0:
                    fail(f"session {short_repr(sid)}: task {short_repr(task)} differs from {short_repr(t0)} on its earlier lines")
                task = t0
            why = check_call_chain(prev_p, prev_o, prompt, new_in, app)
            if why:
                fail(f"session {short_repr(sid)} step {step}: {why}")
            state[sid] = (step + 1, prompt, out, task)
            yield {"session": sid, "step": step, "model": model, "prompt_tokens": prompt,
                   "new_input_tokens": new_in, "output_tokens": out, "gap_s": float(gap), "append_only": app,
                   "task": task, "score": None if score is None else float(score), "line": lineno}


def read_session_trace(path: str | os.PathLike, name: str | None = None) -> SessionSet:
    """Read a whole trace into a :class:`SessionSet` (sessions in order of first appearance).

    The file is read line by line; memory holds the calls' numeric columns.
    An empty trace (no calls) is an error.
    """
    path = os.fspath(path)
    sess_index: dict[str, int] = {}
    sess_ids: list[str] = []
    sess_task: list[int] = []
    models: dict[str, int] = {}
    tasks: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("s", "step", "model", "p", "n", "o", "gap", "app", "score")}
    for r in iter_session_trace(path):
        sid = r["session"]
        s = sess_index.get(sid)
        if s is None:
            s = sess_index[sid] = len(sess_ids)
            sess_ids.append(sid)
            sess_task.append(tasks.setdefault(r["task"], len(tasks)))
        cols["s"].append(s)
        cols["step"].append(r["step"])
        cols["model"].append(models.setdefault(r["model"], len(models)))
        cols["p"].append(r["prompt_tokens"])
        cols["n"].append(r["new_input_tokens"])
        cols["o"].append(r["output_tokens"])
        cols["gap"].append(r["gap_s"])
        cols["app"].append(r["append_only"])
        cols["score"].append(np.nan if r["score"] is None else r["score"])
    if not sess_ids:
        raise InputFileError(path, "the trace holds no calls")
    s_arr = np.asarray(cols["s"], dtype=np.int64)
    order = np.argsort(s_arr, kind="stable")  # within a session, lines are already in step order
    lengths = np.bincount(s_arr, minlength=len(sess_ids))

    def take(k, dtype):
        return np.asarray(cols[k], dtype=dtype)[order]

    return SessionSet.from_arrays(
        model_names=list(models), lengths=lengths, session_ids=sess_ids, task=sess_task,
        task_names=list(tasks), step=take("step", np.int64), model=take("model", np.int32),
        prompt=take("p", np.int64), new_input=take("n", np.int64), output=take("o", np.int64),
        gap_s=take("gap", np.float64), append_only=take("app", bool), score=take("score", np.float64),
        name=name or os.path.splitext(os.path.basename(path))[0], meta={"source": "trace", "path": path},
        validate=False)


def format_session_trace(sessions: SessionSet, f: TextIO) -> int:
    """Write ``sessions`` as session-trace lines to the open text stream ``f``; returns the number of lines.

    Sessions are written one after another, each in step order.
    """
    ss = sessions
    names = ss.model_names
    tasks = ss.task_names
    dumps = json.dumps
    for s in range(ss.n_sessions):
        sid = ss.session_ids[s]
        task = tasks[int(ss.task[s])]
        for i in range(int(ss.offsets[s]), int(ss.offsets[s + 1])):
            rec: dict[str, Any] = {
                "session": sid, "step": int(ss.step[i]), "model": names[int(ss.model[i])],
                "prompt_tokens": int(ss.prompt[i]), "new_input_tokens": int(ss.new_input[i]),
                "output_tokens": int(ss.output[i]), "gap_s": round(float(ss.gap_s[i]), 6),
                "append_only": bool(ss.append_only[i])}
            if task:
                rec["task"] = task
            if not np.isnan(ss.score[i]):
                rec["score"] = float(ss.score[i])
            f.write(dumps(rec, separators=(",", ":")))
            f.write("\n")
    return ss.n_calls


def write_session_trace(sessions: SessionSet, path: str | os.PathLike) -> int:
    """Write ``sessions`` as a session trace file (atomically); returns the number of lines."""
    atomic_write(path, lambda f: format_session_trace(sessions, f))
    return sessions.n_calls
