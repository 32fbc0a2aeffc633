"""Agent sessions: sequences of LLM calls, each routed to one model.

A *session* is one agent task: calls ``step = s0, s0+1, ...`` issued one after
another.  Each call carries

``model``             the model the router sent it to;
``prompt_tokens``     P, the whole prompt;
``new_input_tokens``  N, the prompt tokens that do not continue the session's
                      previous context: the first ``H = P - N`` tokens of the
                      prompt (the *history*) are identical to the start of the
                      previous call's prompt followed by its output;
``output_tokens``     O, tokens generated;
``gap_s``             the time between the previous call's completion (for the
                      first call: the session's start) and this call;
``append_only``       whether the history is the *whole* previous context,
                      ``H == P_prev + O_prev`` (an agent loop that only
                      appends).  ``false`` marks a rewritten history
                      (compaction, truncation, edits): only the first ``H``
                      tokens carry over.  The first call has ``H == 0``;
``score``             optional correctness of the routed model on this call.

The token sequence model behind every cache computation in this package:
each model caches, per session, a prefix of the session's token sequence; a
call on model m reuses ``min(cached_m, H)`` tokens (never more than the
history), and afterwards model m holds the call's prompt and output,
``P + O`` tokens.  A switch call is one whose model differs from the previous
call's model in the same session.

:class:`SessionSet` stores sessions column-wise (NumPy arrays, calls sorted by
session then step, ``offsets`` delimiting sessions) so numba kernels - the
statistics here, the cluster simulator later - can walk them without Python
objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from shadow_prefill.errors import ShadowError

__all__ = ["Call", "SessionSet", "check_call_chain"]


@dataclass(frozen=True)
class Call:
    """One LLM call of a session (the Python view of one row of a :class:`SessionSet`)."""

    session: str
    step: int
    model: str
    prompt_tokens: int
    new_input_tokens: int
    output_tokens: int
    gap_s: float = 0.0
    append_only: bool = True
    task: str = ""
    score: float | None = None

    @property
    def history_tokens(self) -> int:
        return self.prompt_tokens - self.new_input_tokens

    def to_record(self) -> dict:
        """The call as one session-trace JSON object (see ``data/schemas/session-trace.schema.json``)."""
        d: dict[str, Any] = {
            "session": self.session, "step": self.step, "model": self.model,
            "prompt_tokens": self.prompt_tokens, "new_input_tokens": self.new_input_tokens,
            "output_tokens": self.output_tokens, "gap_s": self.gap_s, "append_only": self.append_only,
        }
        if self.task:
            d["task"] = self.task
        if self.score is not None:
            d["score"] = self.score
        return d


def check_call_chain(prev_prompt: int | None, prev_output: int | None, prompt: int, new_input: int,
                     append_only: bool) -> str | None:
    """Why a call cannot follow its predecessor (``None`` when it can).

    ``prev_prompt is None`` for a session's first call, whose history must be
    empty.  Shared by the trace reader (which adds the line number) and
    :meth:`SessionSet.validate`.
    """
    if new_input > prompt:
        return f"new_input_tokens = {new_input} exceeds prompt_tokens = {prompt}"
    hist = prompt - new_input
    if prev_prompt is None:
        if hist != 0:
            return (f"the first call of a session has no history, so new_input_tokens must equal prompt_tokens "
                    f"({prompt}), got {new_input}")
        return None
    prev_len = prev_prompt + prev_output
    if hist > prev_len:
        return (f"the prompt would share {hist} tokens with the history (prompt_tokens - new_input_tokens) but the "
                f"previous call left only {prev_len} (its prompt {prev_prompt} + output {prev_output})")
    if append_only and hist != prev_len:
        return (f"append_only call: prompt_tokens - new_input_tokens = {hist} must equal the previous call's prompt + "
                f"output = {prev_len} (set append_only to false if the history was rewritten)")
    return None


def _as_int_array(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        if not np.issubdtype(a.dtype, np.floating) or not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ShadowError(f"{name} must hold integers")
    return a.astype(np.int64)


@dataclass(frozen=True, eq=False)
class SessionSet:
    """Sessions in columns; build with :meth:`from_calls`, :meth:`from_arrays` or a builder."""

    model_names: tuple[str, ...]
    session_ids: tuple[str, ...]
    offsets: np.ndarray
    task: np.ndarray
    task_names: tuple[str, ...]
    step: np.ndarray
    model: np.ndarray
    prompt: np.ndarray
    new_input: np.ndarray
    output: np.ndarray
    gap_s: np.ndarray
    append_only: np.ndarray
    score: np.ndarray
    name: str = "workload"
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ shape
    @property
    def n_sessions(self) -> int:
        return len(self.session_ids)

    @property
    def n_calls(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def n_models(self) -> int:
        return len(self.model_names)

    @property
    def history(self) -> np.ndarray:
        """``H = P - N`` per call: tokens the call shares with the session's previous context."""
        return self.prompt - self.new_input

    @property
    def session_of_call(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_sessions, dtype=np.int64), np.diff(self.offsets))

    @property
    def lengths(self) -> np.ndarray:
        """Calls per session."""
        return np.diff(self.offsets)

    @property
    def is_first(self) -> np.ndarray:
        first = np.zeros(self.n_calls, dtype=bool)
        first[self.offsets[:-1][self.lengths > 0]] = True
        return first

    @property
    def is_switch(self) -> np.ndarray:
        """Calls routed to a different model than their predecessor in the session."""
        sw = np.zeros(self.n_calls, dtype=bool)
        if self.n_calls > 1:
            sw[1:] = self.model[1:] != self.model[:-1]
        sw &= ~self.is_first
        return sw

    # ------------------------------------------------------------ construction
    @classmethod
    def from_arrays(cls, *, model_names: Sequence[str], lengths: Sequence[int], model: Any, prompt: Any,
                    new_input: Any, output: Any, gap_s: Any = None, append_only: Any = None, score: Any = None,
                    session_ids: Sequence[str] | None = None, task: Any = None,
                    task_names: Sequence[str] | None = None, step: Any = None, name: str = "workload",
                    meta: Mapping | None = None, validate: bool = True) -> "SessionSet":
        """Build from per-call arrays in session order (``lengths`` calls per session)."""
        lengths = _as_int_array(lengths, "lengths")
        if np.any(lengths < 1):
            raise ShadowError("every session needs at least one call")
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        n = int(offsets[-1])
        prompt = _as_int_array(prompt, "prompt")
        if prompt.shape != (n,):
            raise ShadowError(f"prompt must have one entry per call ({n}), got shape {prompt.shape}")

        def col(x, default, dtype, nm):
            a = np.full(n, default, dtype=dtype) if x is None else np.asarray(x, dtype=dtype)
            if a.shape != (n,):
                raise ShadowError(f"{nm} must have one entry per call ({n}), got shape {a.shape}")
            return a.copy()

        if step is None:
            step_a = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        else:
            step_a = _as_int_array(step, "step")
        ns = len(lengths)
        if session_ids is None:
            session_ids = tuple(str(i) for i in range(ns))
        if len(session_ids) != ns:
            raise ShadowError(f"session_ids has {len(session_ids)} entries for {ns} sessions")
        if task is None:
            task_a = np.zeros(ns, dtype=np.int32)
            task_names = tuple(task_names or ("",))
        else:
            task_a = np.asarray(task, dtype=np.int32).copy()
            task_names = tuple(task_names) if task_names is not None else tuple(
                str(i) for i in range(int(task_a.max(initial=-1)) + 1))
        ss = cls(model_names=tuple(model_names), session_ids=tuple(session_ids), offsets=offsets, task=task_a,
                 task_names=task_names, step=step_a,
                 model=_as_int_array(model, "model").astype(np.int32), prompt=prompt,
                 new_input=col(new_input, 0, np.int64, "new_input"), output=col(output, 0, np.int64, "output"),
                 gap_s=col(gap_s, 0.0, np.float64, "gap_s"), append_only=col(append_only, True, bool, "append_only"),
                 score=col(score, np.nan, np.float64, "score"), name=name, meta=dict(meta or {}))
        if validate:
            ss.validate()
        return ss

    @classmethod
    def from_calls(cls, calls: Iterable[Call | Mapping[str, Any]], model_names: Sequence[str] | None = None,
                   name: str = "workload", meta: Mapping | None = None) -> "SessionSet":
        """Build from :class:`Call` objects or trace records (any order; grouped by session, sorted by step)."""
        groups: dict[str, list[Call]] = {}
        for c in calls:
            if not isinstance(c, Call):
                c = Call(session=str(c["session"]), step=int(c["step"]), model=str(c["model"]),
                         prompt_tokens=int(c["prompt_tokens"]), new_input_tokens=int(c["new_input_tokens"]),
                         output_tokens=int(c["output_tokens"]), gap_s=float(c.get("gap_s", 0.0)),
                         append_only=bool(c.get("append_only", True)), task=str(c.get("task", "") or ""),
                         score=c.get("score"))
            groups.setdefault(c.session, []).append(c)
        names = list(model_names) if model_names is not None else []
        for cs in groups.values():
            for c in cs:
                if c.model not in names:
                    if model_names is not None:
                        raise ShadowError(f"session {c.session!r} step {c.step}: unknown model {c.model!r} "
                                          f"(known: {', '.join(names)})")
                    names.append(c.model)
        tasks: list[str] = []
        rows: list[Call] = []
        lengths, task_idx, sids = [], [], []
        for sid, cs in groups.items():
            cs.sort(key=lambda c: c.step)
            for a, b in zip(cs, cs[1:]):
                if b.step != a.step + 1:
                    raise ShadowError(f"session {sid!r}: steps must increase by 1, got {a.step} then {b.step}")
            t = cs[0].task
            if t not in tasks:
                tasks.append(t)
            rows.extend(cs)
            lengths.append(len(cs))
            task_idx.append(tasks.index(t))
            sids.append(sid)
        midx = {m: i for i, m in enumerate(names)}
        return cls.from_arrays(
            model_names=names, lengths=lengths, session_ids=sids, task=task_idx, task_names=tasks or [""],
            step=[c.step for c in rows], model=[midx[c.model] for c in rows],
            prompt=[c.prompt_tokens for c in rows], new_input=[c.new_input_tokens for c in rows],
            output=[c.output_tokens for c in rows], gap_s=[c.gap_s for c in rows],
            append_only=[c.append_only for c in rows],
            score=[np.nan if c.score is None else c.score for c in rows], name=name, meta=meta)

    # --------------------------------------------------------------- checking
    def validate(self) -> None:
        """Raise :class:`ShadowError` naming the first call that breaks a rule of the format."""
        n = self.n_calls
        if self.offsets[0] != 0 or self.offsets[-1] != n or np.any(np.diff(self.offsets) < 1):
            raise ShadowError("offsets must start at 0, end at the number of calls and give every session a call")
        if self.task.shape != (self.n_sessions,):
            raise ShadowError("task must have one entry per session")
        if self.n_sessions and (self.task.min() < 0 or self.task.max() >= len(self.task_names)):
            raise ShadowError("task indices must point into task_names")
        if n == 0:
            return
        if self.model.min() < 0 or self.model.max() >= self.n_models:
            raise ShadowError("model indices must point into model_names")
        bad = np.flatnonzero((self.prompt < 1) | (self.new_input < 0) | (self.output < 0)
                             | ~np.isfinite(self.gap_s) | (self.gap_s < 0) | (self.new_input > self.prompt)
                             | (self.step < 0))
        first = self.is_first
        prev_len = np.zeros(n, dtype=np.int64)
        prev_len[1:] = self.prompt[:-1] + self.output[:-1]
        hist = self.history
        step_ok = np.ones(n, dtype=bool)
        step_ok[1:] = self.step[1:] == self.step[:-1] + 1
        chain_bad = np.flatnonzero(
            (first & (hist != 0)) | (~first & (hist > prev_len)) | (~first & self.append_only & (hist != prev_len))
            | (~first & ~step_ok))
        idx = np.union1d(bad, chain_bad)
        if idx.size == 0:
            return
        i = int(idx[0])
        s = int(np.searchsorted(self.offsets, i, side="right") - 1)
        where = f"session {self.session_ids[s]!r} step {int(self.step[i])}"
        if self.prompt[i] < 1:
            raise ShadowError(f"{where}: prompt_tokens must be >= 1, got {int(self.prompt[i])}")
        if self.new_input[i] < 0 or self.output[i] < 0:
            raise ShadowError(f"{where}: token counts must be >= 0")
        if not math.isfinite(self.gap_s[i]) or self.gap_s[i] < 0:
            raise ShadowError(f"{where}: gap_s must be a finite number >= 0, got {self.gap_s[i]!r}")
        if self.step[i] < 0:
            raise ShadowError(f"{where}: step must be >= 0")
        if not first[i] and not step_ok[i]:
            raise ShadowError(f"{where}: steps must increase by 1 (previous step {int(self.step[i - 1])})")
        why = check_call_chain(None if first[i] else int(self.prompt[i - 1]),
                               None if first[i] else int(self.output[i - 1]),
                               int(self.prompt[i]), int(self.new_input[i]), bool(self.append_only[i]))
        raise ShadowError(f"{where}: {why}")

    # ------------------------------------------------------------------ views
    def calls(self) -> Iterator[Call]:
        """Every call as a :class:`Call`, in session then step order."""
        for s in range(self.n_sessions):
            yield from self.session(s)

    def session(self, s: int) -> list[Call]:
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        sid, task = self.session_ids[s], self.task_names[int(self.task[s])]
        return [Call(session=sid, step=int(self.step[i]), model=self.model_names[int(self.model[i])],
                     prompt_tokens=int(self.prompt[i]), new_input_tokens=int(self.new_input[i]),
                     output_tokens=int(self.output[i]), gap_s=float(self.gap_s[i]),
                     append_only=bool(self.append_only[i]), task=task,
                     score=None if np.isnan(self.score[i]) else float(self.score[i]))
                for i in range(a, b)]

    def summary(self) -> dict:
        """Sizes of the workload (for reports)."""
        return {"name": self.name, "models": list(self.model_names), "sessions": self.n_sessions,
                "calls": self.n_calls, "mean_calls_per_session": (self.n_calls / self.n_sessions) if self.n_sessions else 0.0,
                "mean_prompt_tokens": float(self.prompt.mean()) if self.n_calls else 0.0,
                "mean_output_tokens": float(self.output.mean()) if self.n_calls else 0.0}
