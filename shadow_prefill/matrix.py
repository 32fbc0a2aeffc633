"""Routing-benchmark matrices and the accuracy-per-cost routing policy.

A routing-benchmark matrix (the format of LLMRouter's preprocessed data, e.g.
``../shared/data/llmrouter-dcrouter/``) has two files:

* the **queries** file: a JSON array (or JSONL, one object per line) with one
  object per query::

      {"question": "Q: ...", "scores": {"model-a": 1.0, "model-b": 0.0, ...}, "cluster_id": 2}

  ``question`` (alias ``query``) is the query text, ``scores`` the correctness
  of every candidate model on it (numbers >= 0; every query scores the same
  models) and ``cluster_id`` (alias ``task``; optional) a task label;
* the **models** file (``models.json``): an object ``{"model-a": {"size":
  "7B", "input_price": 0.2, "output_price": 0.2, ...}, ...}`` with prices in
  dollars per million tokens; ``size`` (optional) orders a pair into its small
  and large model.

Errors name the file, the line the offending entry starts on and the field.
Every field is checked for its JSON type (a string where a number belongs is
refused, never converted), finiteness and range; a score or price is a JSON
number, a question a string; files may be gzip'ed (``.gz``), and one cut short
is reported as such.

The accuracy-per-cost policy (LLMRouter's, as the ShadowPrefill paper replays
it) sends a query to the model with the highest score per dollar, where the
dollar cost of a query on model m is ``(input_price_m * input_tokens +
output_price_m * output_tokens) / 1e6`` for the query's own tokens.  A zero
score is worth zero on every model, so a query no model gets right goes to
the cheapest; ties go to the cheaper model, then to the model listed first.
A model with cost 0 and a positive score wins outright.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.inputs import short_repr, check_float, parse_json_value, read_input_text

__all__ = ["RoutingMatrix", "load_matrix", "load_prices", "route_accuracy_per_cost", "ModelPrice", "parse_size_b"]


@dataclass(frozen=True)
class ModelPrice:
    """List prices of one model in dollars per million tokens, and its size (billions of parameters)."""

    input_price: float
    output_price: float
    size_b: float | None = None


@dataclass
class RoutingMatrix:
    """Queries x models correctness scores, with the models' prices."""

    model_names: tuple[str, ...]
    scores: np.ndarray            # (n_queries, n_models) float64
    questions: list[str]
    task: list[str]               # per query ("" when the file has no task label)
    prices: dict[str, ModelPrice]
    path: str = ""

    @property
    def n_queries(self) -> int:
        return int(self.scores.shape[0])

    def model_index(self, name: str) -> int:
        try:
            return self.model_names.index(name)
        except ValueError:
            raise ShadowError(f"model {name!r} is not in the matrix (models: {', '.join(self.model_names)})") from None

    def ordered_pair(self, a: str, b: str) -> tuple[str, str]:
        """``(small, large)``: by size, then input price, then name."""
        for m in (a, b):
            self.model_index(m)
        if a == b:
            raise ShadowError(f"a model pair needs two different models, got {a!r} twice")

        def key(m):
            p = self.prices[m]
            return (p.size_b if p.size_b is not None else math.inf, p.input_price + p.output_price, m)

        return tuple(sorted((a, b), key=key))  # type: ignore[return-value]

    def all_pairs(self) -> list[tuple[str, str]]:
        """Every unordered pair of the matrix's models, each as ``(small, large)``."""
        names = self.model_names
        return [self.ordered_pair(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([bBmMkKtT]?)\s*$")


def parse_size_b(size: Any) -> float | None:
    """``"7B"`` -> 7.0, ``"500M"`` -> 0.5, a number -> itself (billions); ``None`` when absent or unreadable."""
    if size is None or isinstance(size, bool):
        return None
    if isinstance(size, (int, float)):
        try:
            v = float(size)
        except OverflowError:  # an integer too large for a float
            return None
        return v if math.isfinite(v) and v > 0 else None
    m = _SIZE_RE.match(str(size)[:64])
    if not m:
        return None
    v = float(m.group(1))
    unit = m.group(2).upper()
    v *= {"": 1.0, "B": 1.0, "M": 1e-3, "K": 1e-6, "T": 1e3}[unit]
    return v if math.isfinite(v) and v > 0 else None


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _read_text(path: str) -> str:
    return read_input_text(path)


def _iter_entries(path: str, text: str) -> Iterator[tuple[int, Any]]:
    """(line, value) of each element of a top-level JSON array, or of each JSONL line."""
    dec = json.JSONDecoder()
    i = 0
    n = len(text)
    line_pos, line_no = 0, 1  # line number at line_pos, advanced incrementally (text.count is O(n) per call)

    def line_at(pos: int) -> int:
        nonlocal line_pos, line_no
        if pos >= line_pos:
            line_no += text.count("\n", line_pos, pos)
        else:
            line_no = _line_of(text, pos)
        line_pos = pos
        return line_no

    while i < n and text[i] in " \t\r\n":
        i += 1
    if i < n and text[i] == "[":
        i += 1
        first = True
        while True:
            while i < n and text[i] in " \t\r\n":
                i += 1
            if i >= n:
                raise InputFileError(path, "unterminated JSON array", _line_of(text, i))
            if text[i] == "]":
                i += 1
                break
            if not first:
                if text[i] != ",":
                    raise InputFileError(path, "invalid JSON: expected ',' or ']' between entries", _line_of(text, i))
                i += 1
                while i < n and text[i] in " \t\r\n":
                    i += 1
            try:
                val, j = dec.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise InputFileError(path, f"invalid JSON: {e.msg}", e.lineno) from None
            except RecursionError:
                raise InputFileError(path, "invalid JSON: nested too deeply", _line_of(text, i)) from None
            except ValueError as e:  # an integer literal of more than 4300 digits
                raise InputFileError(path, f"invalid JSON: a number too long to read ({str(e).split(':')[0]})",
                                     _line_of(text, i)) from None
            yield line_at(i), val
            i = j
            first = False
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n:
            raise InputFileError(path, "extra data after the JSON array", _line_of(text, i))
        return
    for k, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        yield k, parse_json_value(line, path, k)


def load_prices(path: str | os.PathLike) -> dict[str, ModelPrice]:
    """Read a ``models.json`` price file (see the module doc)."""
    path = os.fspath(path)
    text = _read_text(path)
    doc = parse_json_value(text, path)
    if not isinstance(doc, dict) or not doc:
        raise InputFileError(path, "must be a non-empty JSON object mapping model names to {input_price, output_price}")
    out: dict[str, ModelPrice] = {}
    for name, ent in doc.items():
        pos = text.find(json.dumps(name))
        line = _line_of(text, pos) if pos >= 0 else None
        if not isinstance(ent, dict):
            raise InputFileError(path, f"model {short_repr(name)}: must be an object, got {type(ent).__name__}", line)
        vals = []
        for key in ("input_price", "output_price"):
            if key not in ent:
                raise InputFileError(path, f"model {short_repr(name)}: {key} missing", line)

            def fail(msg: str, _name=name):
                raise InputFileError(path, f"model {short_repr(_name)}: {msg}", line)

            vals.append(check_float(ent[key], key, fail, lo=0.0, hi=1e12, unit=" (dollars per million tokens)"))
        size = ent.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, (str, int, float))):
            raise InputFileError(path, f"model {short_repr(name)}: field 'size' must be a string like \"7B\" or a number "
                                       f"of billions, got {type(size).__name__}", line)
        out[name] = ModelPrice(vals[0], vals[1], parse_size_b(size))
    return out


def load_matrix(path: str | os.PathLike, models_path: str | os.PathLike | None = None) -> RoutingMatrix:
    """Read a routing-benchmark matrix and its price file.

    ``models_path`` defaults to ``models.json`` in the queries file's folder.
    Every scored model must have a price.
    """
    path = os.fspath(path)
    text = _read_text(path)  # first: a missing matrix is reported as missing, not as a missing price file
    if models_path is None:
        models_path = os.path.join(os.path.dirname(os.path.abspath(path)), "models.json")
        if not os.path.exists(models_path):
            raise ShadowError(f"{path}: no price file: {models_path!r} does not exist; pass --prices FILE")
    prices = load_prices(models_path)
    names: list[str] | None = None
    rows: list[list[float]] = []
    questions: list[str] = []
    tasks: list[str] = []
    for line, ent in _iter_entries(path, text):
        if not isinstance(ent, dict):
            raise InputFileError(path, f"each query must be a JSON object, got {type(ent).__name__}", line)
        q = ent.get("question", ent.get("query"))
        if not isinstance(q, str):
            raise InputFileError(path, "query needs a 'question' string" if q is None else
                                 f"field 'question' must be a string, got {type(q).__name__}", line)
        sc = ent.get("scores")
        if not isinstance(sc, dict) or not sc:
            raise InputFileError(path, "query needs a non-empty 'scores' object {model: score}" if sc is None else
                                 f"field 'scores' must be a non-empty object {{model: score}}, got "
                                 f"{type(sc).__name__} {short_repr(sc)}", line)
        if names is None:
            names = list(sc)
            if len(names) < 2:
                raise InputFileError(path, "a routing matrix needs scores for at least 2 models", line)
        elif set(sc) != set(names):
            missing = sorted(set(names) - set(sc))
            extra = sorted(set(sc) - set(names))
            raise InputFileError(path, "query scores a different set of models than the first query"
                                 + (f"; missing {', '.join(missing)}" if missing else "")
                                 + (f"; extra {', '.join(extra)}" if extra else ""), line)
        row = []
        for m in names:
            def fail(msg: str, _m=m):
                raise InputFileError(path, f"score of {short_repr(_m)}: {msg}", line)

            row.append(check_float(sc[m], f"scores.{m}", fail, lo=0.0, hi=1e12))
        rows.append(row)
        questions.append(q)
        t = ent.get("cluster_id", ent.get("task", ""))
        if t is None:
            t = ""
        if isinstance(t, bool) or not isinstance(t, (str, int)):
            raise InputFileError(path, f"field 'cluster_id' must be a string or an integer, got {short_repr(t)}", line)
        tasks.append(str(t))
    if names is None:
        raise InputFileError(path, "the matrix holds no queries")
    missing = [m for m in names if m not in prices]
    if missing:
        raise ShadowError(f"{os.fspath(models_path)}: no price for model(s) {', '.join(missing)} scored in {path}")
    return RoutingMatrix(model_names=tuple(names), scores=np.asarray(rows, dtype=np.float64), questions=questions,
                         task=tasks, prices={m: prices[m] for m in names}, path=path)


def route_accuracy_per_cost(scores: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Index of the chosen model per query: highest score per dollar, ties to the cheaper, then the first.

    ``scores`` is ``(n, k)``; ``cost`` is ``(n, k)`` or ``(k,)`` dollars (>= 0).
    """
    scores = np.asarray(scores, dtype=np.float64)
    cost = np.broadcast_to(np.asarray(cost, dtype=np.float64), scores.shape)
    if np.any(cost < 0) or not np.all(np.isfinite(cost)):
        raise ShadowError("costs must be finite and >= 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(scores > 0, scores / cost, 0.0)  # score/0 = inf for a free model that scores
    best = value.max(axis=1, keepdims=True)
    tied_cost = np.where(value == best, cost, np.inf)
    return np.argmin(tied_cost, axis=1).astype(np.int32)
