"""Per-step latency ``L_i(b)`` of one model, measured the way a serving runtime sees it.

Two step shapes, each over a KV cache of ``context`` tokens per request:

* ``decode`` -- every request of the batch appends one token (``T = 1``);
* ``extend`` -- every request appends ``T = extend_tokens`` tokens at once: the
  handoff path of token routing, where a request coming back from a peer model
  brings the peer's tokens and the local model must absorb them before it
  decodes again (the TokenRouter paper, Appendix B, finds this path dominant).

The context stays fixed while timing: after every timed step the cache is
rewound by ``T`` tokens (``cache.crop(-T)``, outside the timed region), so all
samples of one batch size see the same attention length.

Timing.  On CUDA a pair of CUDA events is recorded around every step and all
events are resolved after the loop (one synchronize per batch size, none inside
the timed loop); ``warmup`` untimed steps run first.  With ``cuda_graph`` the
step is captured once into a CUDA graph over a static cache and replayed.  On
CPU ``time.perf_counter`` brackets each step and no ``torch.cuda`` function is
called.

Statistics per batch size: min, median, mean, p90 (linear interpolation), the
sample standard deviation and the count.  The affine law ``L(b) = a + c b`` is
fitted by least squares to the per-batch medians, with
``R^2 = 1 - SS_res / SS_tot`` (1 when every median is equal and fitted exactly).

Co-running (``corun_model``).  The model is timed while another model decodes
continuously beside it on the same device: the other model's step (batch
``corun_batch``, same context, same eager / CUDA-graph choice) is replayed back
to back in its own CUDA stream by a second thread, at most two steps in
flight, and the timed model runs in a stream of its own, timed by its CUDA
events as above.  On CPU the same code path runs with the other model in a
second thread (torch releases the GIL inside its kernels), timed by
``perf_counter``; the figures then say how two models share the cores, not a
GPU.  The other model starts before the warm-up of every batch size (after
its CUDA-graph capture, which runs with nothing beside it), has finished one
step before any timed one, and stops after the last timed step; the profile
records it under ``corun`` (its name, config hash, batch size, how many steps
it ran meanwhile and their mean duration).  Such a profile is ``Lco_i(b)`` of
the spec's ``corun_latency`` (``tr-profile system --corun-profile``).

Memory figures: ``weight_bytes`` (sum over parameters of numel x element size),
``kv_bytes_per_token`` from the config (``2 x layers x kv_heads x head_dim x
dtype bytes``), and on CUDA the allocator peak per batch size and the measured
cache bytes per token.

torch and transformers are imported lazily: importing this module is free.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from tr_core.errors import TRError
from tr_core.fileio import read_json

LATENCY_SCHEMA_VERSION = 1
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MODES = ("decode", "extend")
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash",
                         "_attn_implementation_autoset", "architectures"}

__all__ = ["ProfileError", "BatchStats", "AffineFit", "LatencyProfile", "load_model", "profile_latency",
           "measure_timing_overhead", "summarize_samples", "fit_affine", "load_latency_profile",
           "config_sha256", "kv_bytes_per_token"]


class ProfileError(TRError, ValueError):
    """A profiling request is invalid or cannot run here; the message names the flag or file."""


def _torch():
    try:
        import torch
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ProfileError(f"this command needs torch and transformers (pip install 'tokenrouter-model[profile]'): "
                           f"{e}") from None
    return torch, transformers


# ----------------------------------------------------------------------------
# statistics (numpy only)

@dataclass(frozen=True)
class BatchStats:
    batch_size: int
    count: int
    min_ms: float
    median_ms: float
    mean_ms: float
    p90_ms: float
    std_ms: float
    peak_allocated_bytes: int | None = None


@dataclass(frozen=True)
class AffineFit:
    intercept_ms: float
    per_request_ms: float
    r_squared: float


def summarize_samples(batch_size: int, samples_ms: Sequence[float], peak: int | None = None) -> BatchStats:
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0:
        raise ProfileError("no timing samples")
    return BatchStats(int(batch_size), int(x.size), float(x.min()), float(np.median(x)), float(x.mean()),
                      float(np.percentile(x, 90)), float(x.std(ddof=1)) if x.size > 1 else 0.0, peak)


def fit_affine(batch_sizes: Sequence[float], latency_ms: Sequence[float]) -> AffineFit | None:
    """Least-squares ``a + c b`` through the points; None with fewer than 2 distinct batch sizes."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    y = np.asarray(latency_ms, dtype=np.float64)
    if np.unique(b).size < 2:
        return None
    A = np.column_stack([np.ones_like(b), b])
    (a, c), *_ = np.linalg.lstsq(A, y, rcond=None)
    res = y - (a + c * b)
    ss_res = float(res @ res)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else 0.0)
    return AffineFit(float(a), float(c), float(r2))


# ----------------------------------------------------------------------------
# profile document

@dataclass(frozen=True)
class LatencyProfile:
    model: str
    config_sha256: str
    device: str
    dtype: str
    mode: str
    context_tokens: int
    extend_tokens: int
    cuda_graph: bool
    warmup_steps: int
    timed_steps: int
    batches: tuple[BatchStats, ...]
    fit: AffineFit | None
    weight_bytes: int
    kv_bytes_per_token: int | None
    measured_kv_bytes_per_token: float | None = None
    timing: str = "perf_counter"
    timing_overhead: dict | None = None
    tool_version: str = ""
    torch_version: str = ""
    transformers_version: str = ""
    arguments: dict = field(default_factory=dict)
    created_utc: str = ""
    attention: str = ""
    input_embedding_bytes: int | None = None
    roofline: dict | None = None
    corun: dict | None = None

    @property
    def is_corun(self) -> bool:
        """Whether the steps were timed while another model ran beside them (a co-running profile)."""
        return self.corun is not None

    def median_ms(self) -> dict[int, float]:
        return {s.batch_size: s.median_ms for s in self.batches}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batches"] = [asdict(s) for s in self.batches]
        d["fit"] = asdict(self.fit) if self.fit else None
        if d["corun"] is None:
            del d["corun"]  # a solo profile reads and writes as before the co-running block existed
        return {"schema_version": LATENCY_SCHEMA_VERSION, "kind": "latency_profile", **d}


_MAX_INT = 2 ** 63 - 1
_MAX_DEPTH = 16


class _Field:
    """Type and range checks of one decoded JSON document; every message names the file and the field."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, key: str, want: str, v: Any):
        shown = json.dumps(v)[:60] if _depth(v) < _MAX_DEPTH else "(deeply nested value)"
        raise ProfileError(f"{self.path}: field {key!r} must be {want}, got {shown}")

    def int_(self, v: Any, key: str, lo: int = 0, none: bool = False):
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= _MAX_INT:
            self.fail(key, f"an integer in {lo}..2^63-1" + (" or null" if none else ""), v)
        return v

    def num(self, v: Any, key: str, lo: float | None = 0.0, positive: bool = False, none: bool = False):
        if v is None and none:
            return None
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and abs(v) <= 1e300 and math.isfinite(v)
        if ok and lo is not None:
            ok = v > lo if positive else v >= lo
        if not ok:
            rng = "" if lo is None else (f" > {lo:g}" if positive else f" >= {lo:g}")
            self.fail(key, f"a finite number{rng}" + (" or null" if none else ""), v)
        return float(v)

    def str_(self, v: Any, key: str, choices: Sequence[str] | None = None):
        if not isinstance(v, str) or (choices is not None and v not in choices):
            self.fail(key, "one of " + ", ".join(choices) if choices else "a string", v)
        return v

    def bool_(self, v: Any, key: str):
        if not isinstance(v, bool):
            self.fail(key, "true or false", v)
        return v

    def obj(self, v: Any, key: str, none: bool = False):
        if v is None and none:
            return None
        if not isinstance(v, dict):
            self.fail(key, "an object" + (" or null" if none else ""), v)
        if _depth(v) > _MAX_DEPTH:
            raise ProfileError(f"{self.path}: field {key!r} is nested more than {_MAX_DEPTH} levels deep")
        return v


def _depth(v: Any, limit: int = _MAX_DEPTH + 1) -> int:
    """Nesting depth of a decoded JSON value, counted up to ``limit`` (iterative: no recursion limit)."""
    best, stack = 0, [(v, 0)]
    while stack:
        x, d = stack.pop()
        best = max(best, d)
        if best >= limit:
            return best
        if isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
    return best


_PROFILE_FIELDS = {f.name for f in __import__("dataclasses").fields(LatencyProfile)}


ORDER_RTOL = 1e-9  # relative slack of the order checks between one sample's statistics


def _check_order(path: str, key: str, b: "BatchStats") -> None:
    """Statistics of one sample cannot disagree: min <= median <= p90, min <= mean; a row that breaks this was
    edited or merged wrongly (tolerance ``ORDER_RTOL`` relative)."""
    def le(x, y):
        return x <= y + ORDER_RTOL * max(abs(x), abs(y), 1e-12)
    for lo, hi, a, c in ((b.min_ms, b.median_ms, "min_ms", "median_ms"), (b.median_ms, b.p90_ms, "median_ms", "p90_ms"),
                         (b.min_ms, b.mean_ms, "min_ms", "mean_ms")):
        if not le(lo, hi):
            raise ProfileError(f"{path}: {key}: {a} = {lo:g} is above {c} = {hi:g}; statistics of one sample satisfy "
                               f"min <= median <= p90 and min <= mean (tolerance {ORDER_RTOL:g} relative)")


def latency_profile_from_dict(d: Any, path: str = "latency profile") -> LatencyProfile:
    """Validate a decoded profile document field by field (types, ranges, finiteness, depth)."""
    F = _Field(path)
    if not isinstance(d, dict) or d.get("kind") != "latency_profile":
        raise ProfileError(f"{path}: not a latency profile (expected \"kind\": \"latency_profile\")")
    if d.get("schema_version") != LATENCY_SCHEMA_VERSION or isinstance(d.get("schema_version"), bool):
        raise ProfileError(f"{path}: unsupported schema_version {json.dumps(d.get('schema_version'))[:40]} "
                           f"(this version reads {LATENCY_SCHEMA_VERSION})")
    unknown = sorted(set(d) - _PROFILE_FIELDS - {"schema_version", "kind"})
    if unknown:
        raise ProfileError(f"{path}: unknown field {unknown[0][:60]!r}")
    required = ("model", "config_sha256", "device", "dtype", "mode", "context_tokens", "extend_tokens",
                "cuda_graph", "warmup_steps", "timed_steps", "batches", "fit", "weight_bytes", "kv_bytes_per_token")
    missing = [k for k in required if k not in d]
    if missing:
        raise ProfileError(f"{path}: missing field {missing[0]!r}")
    raw = d["batches"]
    if not isinstance(raw, list) or not raw:
        F.fail("batches", "a non-empty list of batch-size objects", raw)
    batches = []
    seen = set()
    for k, b in enumerate(raw):
        key = f"batches[{k}]"
        F.obj(b, key)
        extra = sorted(set(b) - {"batch_size", "count", "min_ms", "median_ms", "mean_ms", "p90_ms", "std_ms",
                                 "peak_allocated_bytes"})
        if extra:
            raise ProfileError(f"{path}: unknown field {key + '.' + extra[0][:60]!r}")
        for name in ("batch_size", "count", "min_ms", "median_ms", "mean_ms", "p90_ms", "std_ms"):
            if name not in b:
                raise ProfileError(f"{path}: missing field {key + '.' + name!r}")
        bs = F.int_(b["batch_size"], f"{key}.batch_size", 1)
        if bs in seen:
            raise ProfileError(f"{path}: field {key + '.batch_size'!r}: batch size {bs} appears twice")
        seen.add(bs)
        st = BatchStats(
            bs, F.int_(b["count"], f"{key}.count", 1), F.num(b["min_ms"], f"{key}.min_ms"),
            F.num(b["median_ms"], f"{key}.median_ms", positive=True), F.num(b["mean_ms"], f"{key}.mean_ms"),
            F.num(b["p90_ms"], f"{key}.p90_ms"), F.num(b["std_ms"], f"{key}.std_ms"),
            F.int_(b.get("peak_allocated_bytes"), f"{key}.peak_allocated_bytes", 0, none=True))
        _check_order(path, key, st)
        batches.append(st)
    fit = F.obj(d["fit"], "fit", none=True)
    if fit is not None:
        for name in ("intercept_ms", "per_request_ms", "r_squared"):
            if name not in fit:
                raise ProfileError(f"{path}: missing field {'fit.' + name!r}")
        fit = AffineFit(F.num(fit["intercept_ms"], "fit.intercept_ms", None),
                        F.num(fit["per_request_ms"], "fit.per_request_ms", None),
                        F.num(fit["r_squared"], "fit.r_squared", None))
    text = {k: F.str_(d.get(k, ""), k) for k in ("model", "config_sha256", "device", "timing", "tool_version",
                                                 "torch_version", "transformers_version", "created_utc",
                                                 "attention")}
    return LatencyProfile(
        model=text["model"], config_sha256=text["config_sha256"], device=text["device"],
        dtype=F.str_(d["dtype"], "dtype", tuple(DTYPES)), mode=F.str_(d["mode"], "mode", MODES),
        context_tokens=F.int_(d["context_tokens"], "context_tokens", 0),
        extend_tokens=F.int_(d["extend_tokens"], "extend_tokens", 1), cuda_graph=F.bool_(d["cuda_graph"], "cuda_graph"),
        warmup_steps=F.int_(d["warmup_steps"], "warmup_steps", 0), timed_steps=F.int_(d["timed_steps"], "timed_steps", 1),
        batches=tuple(batches), fit=fit, weight_bytes=F.int_(d["weight_bytes"], "weight_bytes", 0),
        kv_bytes_per_token=F.int_(d["kv_bytes_per_token"], "kv_bytes_per_token", 0, none=True),
        measured_kv_bytes_per_token=F.num(d.get("measured_kv_bytes_per_token"), "measured_kv_bytes_per_token",
                                          none=True),
        timing=text["timing"] or "perf_counter", timing_overhead=F.obj(d.get("timing_overhead"), "timing_overhead",
                                                                      none=True),
        tool_version=text["tool_version"], torch_version=text["torch_version"],
        transformers_version=text["transformers_version"], arguments=F.obj(d.get("arguments", {}), "arguments"),
        created_utc=text["created_utc"], attention=text["attention"],
        input_embedding_bytes=F.int_(d.get("input_embedding_bytes"), "input_embedding_bytes", 0, none=True),
        roofline=F.obj(d.get("roofline"), "roofline", none=True), corun=_corun_field(F, d.get("corun")))


def _corun_field(F: "_Field", v: Any) -> dict | None:
    """The ``corun`` block of a co-running profile: the other model's name and batch size are required."""
    v = F.obj(v, "corun", none=True)
    if v is None:
        return None
    for name in ("model", "batch_size"):
        if name not in v:
            raise ProfileError(f"{F.path}: missing field {'corun.' + name!r}")
    F.str_(v["model"], "corun.model")
    F.int_(v["batch_size"], "corun.batch_size", 1)
    for name in ("steps",):
        if name in v:
            F.int_(v[name], f"corun.{name}", 0)
    if "mean_step_ms" in v:
        F.num(v["mean_step_ms"], "corun.mean_step_ms", none=True)
    return v


def load_latency_profile(path: str | os.PathLike) -> LatencyProfile:
    """Read and validate a profile JSON written by ``tr-profile latency``; errors name the file and the field."""
    path = os.fspath(path)
    try:
        d = read_json(path, "latency profile", error=ProfileError)
    except ProfileError:
        raise  # already one line naming the file
    except RecursionError:
        raise ProfileError(f"latency profile {path!r} is nested too deeply to be a profile") from None
    except ValueError as e:  # numbers too long to convert, and other decoder limits
        raise ProfileError(f"latency profile {path!r} is not a valid profile: {_first_line(e)}") from None
    return latency_profile_from_dict(d, path)


# ----------------------------------------------------------------------------
# models

def config_sha256(config: Any) -> str:
    """SHA-256 of the architecture fields of a transformers config (canonical JSON)."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    d = {k: v for k, v in d.items() if k not in _VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def _text_config(config: Any) -> Any:
    from tr_core.model_config import text_config
    return text_config(config)


def kv_bytes_per_token(config: Any, dtype: str) -> int | None:
    """KV-cache bytes per token: 2 (K and V) x layers x kv heads x head dim x dtype bytes."""
    from tr_core.model_config import read_shape
    try:  # the fields' one reader (tr_core.model_config); a config without them has no KV figure
        shape = read_shape(config, "config", error=ProfileError, require_intermediate=False, require_vocab=False)
    except ProfileError:
        return None
    return shape.kv_bytes_per_token(DTYPE_BYTES[dtype])


def _read_config_dict(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    d = read_json(path, "config file", error=ProfileError)
    if not isinstance(d, dict) or "model_type" not in d:
        raise ProfileError(f"config file {path!r} needs a \"model_type\" field (e.g. \"llama\", \"qwen2\")")
    return d


def resolve_device(device: str) -> str:
    torch, _ = _torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ProfileError(f"--device {device}: CUDA is not available on this machine")
        return device
    if device != "cpu":
        raise ProfileError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


def load_model(model_path: str | None = None, config_path: str | None = None, *, dtype: str = "fp32",
               device: str = "cpu", seed: int = 0):
    """Load a causal LM from a local HF folder (real weights) or build it from a config (random weights).

    Never contacts a hub (``local_files_only``).  Returns ``(model, name)``.
    """
    if (model_path is None) == (config_path is None):
        raise ProfileError("give exactly one of --model PATH or --config FILE")
    if dtype not in DTYPES:
        raise ProfileError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch, transformers = _torch()
    tdtype = getattr(torch, DTYPES[dtype])
    if model_path is not None:
        if not os.path.isdir(model_path):
            raise ProfileError(f"--model {model_path!r} is not a directory (a local Hugging Face model folder)")
        if not os.path.exists(os.path.join(model_path, "config.json")):
            raise ProfileError(f"--model {model_path!r} has no config.json")
        try:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    model_path, dtype=tdtype, local_files_only=True)
            except TypeError:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    model_path, torch_dtype=tdtype, local_files_only=True)
        except MemoryError:
            raise
        except Exception as e:  # unreadable weights, a config transformers refuses, an unknown architecture
            raise ProfileError(f"cannot load model from {model_path!r}: {_first_line(e)}") from None
        _check_architecture(model.config, f"--model {model_path!r}")
        model = model.to(device)
        name = os.path.basename(os.path.normpath(model_path))
    else:
        d = _read_config_dict(config_path)
        mt = d.pop("model_type")
        try:
            cfg = transformers.AutoConfig.for_model(mt, **d)
        except MemoryError:
            raise
        except Exception as e:  # transformers' config validation raises its own error classes (version-dependent)
            raise ProfileError(f"config {config_path!r}: {_first_line(e)}") from None
        _check_architecture(cfg, f"config {config_path!r}")
        torch.manual_seed(seed)
        try:
            with torch.device(device):
                try:
                    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=tdtype)
                except TypeError:
                    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=tdtype)
        except MemoryError:
            raise
        except Exception as e:  # an architecture torch cannot build from these values
            raise ProfileError(f"config {config_path!r}: {_first_line(e)}") from None
        model = model.to(device=device, dtype=tdtype)
        name = os.path.splitext(os.path.basename(os.path.normpath(config_path)))[0]
        if name == "config":
            name = os.path.basename(os.path.dirname(os.path.abspath(config_path)))
    model.eval()
    return model, name


_ARCH_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "head_dim")


def _check_architecture(config: Any, where: str) -> None:
    """The sizes a step's cost depends on must be positive integers (transformers accepts some that are not)."""
    text = _text_config(config)
    for name in _ARCH_FIELDS:
        v = getattr(text, name, None)
        if v is None and name in ("num_key_value_heads", "head_dim", "intermediate_size"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"{where}: field {name!r} must be an integer >= 1, got {json.dumps(v)[:40]}")


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _forward_kwargs(model) -> tuple[str, dict]:
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    extra: dict = {"use_cache": True}
    if "logits_to_keep" in params:
        extra["logits_to_keep"] = 1
    elif "num_logits_to_keep" in params:
        extra["num_logits_to_keep"] = 1
    return cache_kw, extra


def _vocab_size(model) -> int:
    from tr_core.model_config import config_int
    return config_int(_text_config(model.config), "vocab_size", "model config", error=ProfileError)


def _static_cache(transformers, model, batch_size: int, length: int, device: str):
    """A ``StaticCache`` of ``length`` slots, built with the keywords this transformers version takes.

    4.45-4.4x want the batch size, device and dtype up front (``batch_size``,
    later ``max_batch_size``); 4.5x and 5.x allocate lazily on the first update.
    """
    params = inspect.signature(transformers.StaticCache.__init__).parameters
    kw: dict = {"config": model.config, "max_cache_len": int(length)}
    if "batch_size" in params:
        kw["batch_size"] = int(batch_size)
    elif "max_batch_size" in params:
        kw["max_batch_size"] = int(batch_size)
    if "device" in params:
        kw["device"] = device
    if "dtype" in params:
        kw["dtype"] = next(model.parameters()).dtype
    return transformers.StaticCache(**kw)


def _seq_length(cache) -> int:
    n = cache.get_seq_length()
    return int(n.item() if hasattr(n, "item") else n)


class _Stepper:
    """One batch size: a KV cache holding ``context`` tokens per request and a step appending ``T`` tokens.

    The same code drives transformers 4.45 through 5.x; it detects, rather than
    reads from a version string, how this version places new tokens:

    * the model's ``forward`` takes ``cache_position`` (4.x): the positions are
      passed explicitly (a fixed tensor ``context .. context+T-1``), so every
      step, eager or replayed from a CUDA graph, writes the same cache slots and
      a static cache needs no rewind;
    * the cache layers keep a device-side write index (``cumulative_length``,
      5.x): every step and every graph replay advances it by T, and the rewind
      moves it back, with the public ``crop(-T)`` where every layer has one,
      else by subtracting T in place (5.1x static layers have no ``crop``);
    * a dynamic cache is rewound with ``crop(-T)``, the public call of every
      version (negative = remove T tokens).

    Rewinds run under ``torch.inference_mode`` because the cache tensors were
    created there.  :meth:`check_rewind` verifies once, before timing, that a
    step plus a rewind leaves the cache length unchanged.
    """

    def __init__(self, model, batch_size: int, context: int, T: int, *, static: bool, device: str, seed: int):
        torch, transformers = _torch()
        self.torch = torch
        self.model = model
        self.T = T
        self.context = context
        self.static = bool(static)
        cache_kw, extra = _forward_kwargs(model)
        self.explicit_positions = "cache_position" in inspect.signature(model.forward).parameters
        vocab = _vocab_size(model)
        g = torch.Generator(device="cpu").manual_seed(seed)
        ids_ctx = torch.randint(0, vocab, (batch_size, max(context, 1)), generator=g).to(device)
        self.ids = torch.randint(0, vocab, (batch_size, T), generator=g).to(device)
        if static:
            self.cache = _static_cache(transformers, model, batch_size, context + T, device)
        else:
            self.cache = transformers.DynamicCache()
        self.kw = {cache_kw: self.cache, **extra}
        from profiler.serving_attention import own_attention
        with torch.inference_mode(), own_attention(model):  # the prefill fills only part of a static cache
            if context > 0:
                kw = dict(self.kw)
                if self.explicit_positions:
                    kw["cache_position"] = torch.arange(context, device=device)
                model(input_ids=ids_ctx[:, :context], **kw)
        if self.explicit_positions:
            self.kw["cache_position"] = torch.arange(context, context + T, device=device)
        self._write_index = [t for t in (getattr(layer, "cumulative_length", None)
                                         for layer in getattr(self.cache, "layers", ()))
                             if isinstance(t, torch.Tensor)] if static else []
        self._layer_crop = static and bool(getattr(self.cache, "layers", None)) and all(
            callable(getattr(layer, "crop", None)) for layer in self.cache.layers)
        self.graph = None
        self.out = None

    def rewind(self) -> None:
        """Put the cache back to ``context`` tokens per request (outside the timed region)."""
        with self.torch.inference_mode():
            if not self.static:
                self.cache.crop(-self.T)
            elif self._write_index:
                if self._layer_crop:
                    self.cache.crop(-self.T)
                else:
                    for t in self._write_index:
                        t.sub_(self.T)
            elif not self.explicit_positions:
                raise ProfileError("this transformers version's static cache has neither explicit positions nor a "
                                   "write index; the profiler cannot rewind it (run without --cuda-graph)")
            # else: explicit cache_position -> every step writes the same slots

    def check_rewind(self) -> None:
        """One eager step + rewind must leave the cache length as it was (API drift shows up here)."""
        if self.static and self.explicit_positions and not self._write_index:
            return  # 4.x static caches count non-empty slots; the explicit positions already fix the slots
        before = _seq_length(self.cache)
        self.eager_step()
        self.rewind()
        after = _seq_length(self.cache)
        if after != before:
            import transformers
            raise ProfileError(f"the KV cache holds {after} tokens after a step and a rewind, expected {before} "
                               f"(transformers {transformers.__version__}: unsupported cache API)")

    def eager_step(self):
        with self.torch.inference_mode():
            return self.model(input_ids=self.ids, **self.kw)

    def capture(self, warmup: int) -> None:
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(max(2, warmup)):
                self.eager_step()
                self.rewind()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode():
            with torch.cuda.graph(self.graph):
                self.out = self.model(input_ids=self.ids, **self.kw)
        # capture records kernels without running them: the cache (and a device-side write index) is
        # still at ``context`` tokens; every replay advances it by T and the timing loop rewinds after each

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.out = self.eager_step()


def _time_steps(stepper: _Stepper, n: int, cuda: bool, stream=None) -> list[float]:
    """Per-step ms; with ``stream`` (co-running) only that stream is waited for, never the whole device."""
    if cuda:
        torch = stepper.torch
        sync = stream.synchronize if stream is not None else torch.cuda.synchronize
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        sync()
        for k in range(n):
            starts[k].record()
            stepper.step()
            ends[k].record()
            stepper.rewind()  # after the end event: not timed
        sync()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        stepper.step()
        t1 = time.perf_counter()
        stepper.rewind()
        out.append((t1 - t0) * 1e3)
    return out


def measure_timing_overhead(stepper: _Stepper, n: int, cuda: bool, repeats: int = 5) -> dict:
    """Relative cost of timing every step (events or perf_counter) against an untimed loop.

    Alternates ``repeats`` times: a loop of ``n`` steps bracketed once, and the
    same loop with per-step timing, also bracketed once; reports the medians of
    the per-step wall times and ``overhead = timed / untimed - 1``.
    """
    torch = stepper.torch
    plain, timed = [], []

    def bracket(fn):
        if cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / n
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3 / n

    def loop_plain():
        for _ in range(n):
            stepper.step()
            stepper.rewind()

    def loop_timed():
        if cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for k in range(n):
                starts[k].record()
                stepper.step()
                ends[k].record()
                stepper.rewind()
        else:
            acc = 0.0
            for _ in range(n):
                t0 = time.perf_counter()
                stepper.step()
                acc += time.perf_counter() - t0
                stepper.rewind()

    for _ in range(repeats):
        plain.append(bracket(loop_plain))
        timed.append(bracket(loop_timed))
    p, t = float(np.median(plain)), float(np.median(timed))
    return {"method": "cuda_events" if cuda else "perf_counter", "steps_per_loop": n, "repeats": repeats,
            "untimed_step_ms": p, "timed_step_ms": t, "overhead": t / p - 1.0 if p > 0 else None}


def profile_latency(model, *, name: str, batch_sizes: Sequence[int], mode: str = "decode", context: int = 128,
                    extend_tokens: int = 8, warmup: int = 3, steps: int = 20, cuda_graph: bool = False,
                    device: str = "cpu", dtype: str = "fp32", seed: int = 0, measure_overhead: bool = False,
                    attention: str = "serving", bandwidth_gbs: float | None = None, measure_bandwidth: bool = True,
                    arguments: dict | None = None, progress=None, corun_model=None, corun_name: str = "",
                    corun_batch: int = 1) -> LatencyProfile:
    """Time ``steps`` steps per batch size after ``warmup`` untimed ones; see the module docstring.

    ``corun_model``: another loaded model that decodes batches of
    ``corun_batch`` continuously beside the timed one (the co-running
    latency; see the module docstring); ``corun_name`` names it in the profile.

    ``attention``: 'serving' (:mod:`profiler.serving_attention`, what a serving
    engine runs) or 'transformers' (the model's own).  On CUDA, or with
    ``bandwidth_gbs``, the profile carries a roofline (:mod:`profiler.roofline`).
    Any failure of torch or transformers inside the loop becomes a
    :class:`ProfileError` naming the batch size.
    """
    if mode not in MODES:
        raise ProfileError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    sizes = [int(b) for b in batch_sizes]
    if not sizes:
        raise ProfileError("--batch-sizes needs at least one value")
    for b in sizes:
        if b < 1:
            raise ProfileError(f"--batch-sizes entries must be >= 1, got {b}")
    if context < 0:
        raise ProfileError(f"--context must be >= 0 tokens, got {context}")
    if mode == "extend" and extend_tokens < 1:
        raise ProfileError(f"--extend-tokens must be >= 1, got {extend_tokens}")
    if mode == "decode" and context < 1:
        raise ProfileError("--context must be >= 1 token in decode mode")
    if steps < 1 or warmup < 0:
        raise ProfileError(f"--steps must be >= 1 and --warmup-steps >= 0, got {steps} and {warmup}")
    if bandwidth_gbs is not None and not (bandwidth_gbs > 0 and math.isfinite(bandwidth_gbs)):
        raise ProfileError(f"--bandwidth-gbs must be a finite number > 0, got {bandwidth_gbs}")
    if corun_model is not None and (isinstance(corun_batch, bool) or not isinstance(corun_batch, int)
                                    or corun_batch < 1):
        raise ProfileError(f"--corun-batch-size must be an integer >= 1, got {corun_batch!r}")
    if corun_model is not None and corun_model is model:
        raise ProfileError("--corun needs a second model (a model cannot run beside itself here)")
    from profiler.serving_attention import ATTENTION_CHOICES, select_attention
    if attention not in ATTENTION_CHOICES:
        raise ProfileError(f"--attention must be one of {', '.join(ATTENTION_CHOICES)}, got {attention!r}")
    torch, transformers = _torch()
    cuda = device.startswith("cuda")
    if cuda_graph and not cuda:
        raise ProfileError("--cuda-graph needs a CUDA device")
    T = 1 if mode == "decode" else int(extend_tokens)
    sizes = sorted(set(sizes))
    if cuda and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device).index)  # events and synchronize act on the current device
    stats: list[BatchStats] = []
    measured = {"kv": None, "overhead": None}
    corun_doc = None
    with contextlib.ExitStack() as stack:
        attention_label = stack.enter_context(select_attention(model, attention))
        loop = None
        if corun_model is not None:
            stack.enter_context(select_attention(corun_model, attention))
            try:
                loop = _CorunLoop(corun_model, corun_batch, context, static=cuda_graph, cuda=cuda, device=device,
                                  seed=seed + 7919, warmup=warmup)
            except (ProfileError, MemoryError):
                raise
            except Exception as e:
                raise ProfileError("the co-running model (--corun) failed to start: "
                                   + _failure_text(e, corun_batch, torch, transformers)) from None
        for k, b in enumerate(sizes):
            try:
                stats.append(_profile_one(torch, model, b, k, context=context, T=T, warmup=warmup, steps=steps,
                                          cuda=cuda, cuda_graph=cuda_graph, device=device, seed=seed,
                                          measure_overhead=measure_overhead and loop is None, measured=measured,
                                          corun=loop))
            except (ProfileError, MemoryError):
                raise
            except Exception as e:  # torch/transformers failing inside the loop: one line naming the batch size
                raise ProfileError(_failure_text(e, b, torch, transformers)) from None
            if progress:
                progress(stats[-1])
        if loop is not None:
            corun_doc = {"model": corun_name or "corun", "config_sha256": config_sha256(corun_model.config),
                         "batch_size": int(corun_batch), "context_tokens": int(context),
                         "cuda_graph": bool(cuda_graph),
                         "runner": "own CUDA stream, second thread" if cuda else "second thread (CPU)",
                         "steps": int(loop.total_steps),
                         "mean_step_ms": loop.total_ms / loop.total_steps if loop.total_steps else None}
    measured_kv, overhead = measured["kv"], measured["overhead"]
    fit = fit_affine([s.batch_size for s in stats], [s.median_ms for s in stats])
    dev_name = torch.cuda.get_device_name(torch.device(device)) if cuda else _cpu_name()
    weight_bytes = int(sum(p.numel() * p.element_size() for p in model.parameters()))
    kv_tok = kv_bytes_per_token(model.config, dtype)
    emb = _untied_input_embedding_bytes(model)
    roof = _roofline_of(torch, stats, dev_name, cuda, device, bandwidth_gbs, measure_bandwidth,
                        weight_bytes=weight_bytes, input_embedding_bytes=emb, kv_bytes_per_token=kv_tok,
                        context=context, T=T)
    from profiler import __version__
    return LatencyProfile(
        model=name, config_sha256=config_sha256(model.config), device=dev_name, dtype=dtype, mode=mode,
        context_tokens=int(context), extend_tokens=int(T), cuda_graph=bool(cuda_graph), warmup_steps=int(warmup),
        timed_steps=int(steps), batches=tuple(stats), fit=fit,
        weight_bytes=weight_bytes, kv_bytes_per_token=kv_tok, measured_kv_bytes_per_token=measured_kv,
        timing="cuda_events" if cuda else "perf_counter", timing_overhead=overhead, tool_version=__version__,
        torch_version=torch.__version__, transformers_version=transformers.__version__,
        arguments=dict(arguments or {}), created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        attention=attention_label, input_embedding_bytes=emb, roofline=roof, corun=corun_doc)


class _CorunLoop:
    """The other model of a co-running profile: one step shape, run back to back by a thread while started.

    On CUDA the steps go to the loop's own stream with at most two in flight
    (the thread waits on the event of the step before the last), so the
    other model never pauses for the host and the queue stays short.
    """

    def __init__(self, model, batch: int, context: int, *, static: bool, cuda: bool, device: str, seed: int,
                 warmup: int):
        torch, _ = _torch()
        self.torch, self.cuda, self.device = torch, cuda, device
        self.stepper = _Stepper(model, batch, context, 1, static=static, device=device, seed=seed)
        self.stepper.check_rewind()
        if static:
            self.stepper.capture(warmup)
        self.stream = torch.cuda.Stream(device=device) if cuda else None
        self.total_steps = 0
        self.total_ms = 0.0
        self._thread = None
        self._stop = threading.Event()
        self._running = threading.Event()
        self._error: BaseException | None = None

    def _body(self) -> None:
        torch = self.torch
        try:
            if self.cuda:
                if torch.device(self.device).index is not None:
                    torch.cuda.set_device(torch.device(self.device))  # the current device is per thread
                # the prefill and the capture ran on the default stream
                self.stream.wait_stream(torch.cuda.default_stream(self.stream.device))
                with torch.cuda.stream(self.stream):
                    first = torch.cuda.Event(enable_timing=True)
                    last = torch.cuda.Event(enable_timing=True)
                    first.record()
                    pending: list = []
                    n = 0
                    while not self._stop.is_set():
                        self.stepper.step()
                        self.stepper.rewind()
                        ev = torch.cuda.Event()
                        ev.record()
                        pending.append(ev)
                        n += 1
                        if len(pending) > 2:
                            pending.pop(0).synchronize()
                            self._running.set()
                        elif n == 1:
                            ev.synchronize()
                            self._running.set()
                    last.record()
                    last.synchronize()
                self.total_ms += first.elapsed_time(last)
            else:
                t0 = time.perf_counter()
                n = 0
                while not self._stop.is_set():
                    self.stepper.step()
                    self.stepper.rewind()
                    n += 1
                    self._running.set()
                self.total_ms += (time.perf_counter() - t0) * 1e3
            self.total_steps += n
        except BaseException as e:  # reported by stop() in the calling thread
            self._error = e
        finally:
            self._running.set()

    def start(self) -> None:
        self._stop.clear()
        self._running.clear()
        self._error = None
        self._thread = threading.Thread(target=self._body, name="tr-profile-corun", daemon=True)
        self._thread.start()
        self._running.wait()
        self._raise()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            self._stop.set()
            if isinstance(e, (ProfileError, MemoryError, KeyboardInterrupt)):
                raise e
            raise ProfileError(f"the co-running model (--corun) failed: {type(e).__name__}: {_first_line(e)}")


def _profile_one(torch, model, b: int, k: int, *, context: int, T: int, warmup: int, steps: int, cuda: bool,
                 cuda_graph: bool, device: str, seed: int, measure_overhead: bool, measured: dict,
                 corun: _CorunLoop | None = None) -> BatchStats:
    peak = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    stepper = _Stepper(model, b, context, T, static=cuda_graph, device=device, seed=seed + k)
    try:
        if cuda:
            torch.cuda.synchronize()
            if k == 0 and cuda_graph:
                # a static cache allocates exactly b x (context + T) token slots; dynamic ones over-allocate
                measured["kv"] = (torch.cuda.memory_allocated() - before) / (b * (context + T))
        stepper.check_rewind()
        if cuda_graph:
            try:
                stepper.capture(warmup)
            except RuntimeError as e:
                raise ProfileError(f"CUDA graph capture failed for batch size {b} "
                                   f"({str(e).splitlines()[0]}); run without --cuda-graph") from None
        if corun is None:
            for _ in range(warmup):
                stepper.step()
                stepper.rewind()
            samples = _time_steps(stepper, steps, cuda)
        else:
            samples = _time_corun(torch, stepper, corun, warmup, steps, cuda)
        if cuda:
            peak = int(torch.cuda.max_memory_allocated())
        if measure_overhead and k == 0:
            measured["overhead"] = measure_timing_overhead(stepper, max(steps, 20), cuda)
    finally:
        del stepper
    return summarize_samples(b, samples, peak)


def _time_corun(torch, stepper: _Stepper, corun: _CorunLoop, warmup: int, steps: int, cuda: bool) -> list[float]:
    """Warm-up and timed steps of the measured model in a stream of its own while ``corun`` runs beside it."""
    stream = torch.cuda.Stream(device=corun.device) if cuda else None
    corun.start()
    try:
        with (torch.cuda.stream(stream) if cuda else contextlib.nullcontext()):
            if cuda:
                stream.wait_stream(torch.cuda.default_stream(corun.device))  # the prefill and capture are done
            for _ in range(warmup):
                stepper.step()
                stepper.rewind()
            return _time_steps(stepper, steps, cuda, stream=stream)
    finally:
        corun.stop()


def _failure_text(e: BaseException, b: int, torch, transformers) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    if "out of memory" in first.lower():
        return f"out of device memory at batch size {b}: lower --batch-sizes or --context"
    return (f"profiling failed at batch size {b}: {type(e).__name__}: {first[:300]} "
            f"(torch {torch.__version__}, transformers {transformers.__version__})")


def _untied_input_embedding_bytes(model) -> int:
    """Bytes of the input-embedding table when the output projection does not share it (see profiler.roofline)."""
    try:
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return 0
    if out is not None and getattr(out, "weight", None) is not None and out.weight.data_ptr() == emb.data_ptr():
        return 0
    return int(emb.numel() * emb.element_size())


def _roofline_of(torch, stats, dev_name: str, cuda: bool, device: str, bandwidth_gbs, measure_bandwidth: bool, *,
                 weight_bytes: int, input_embedding_bytes: int, kv_bytes_per_token, context: int, T: int):
    from profiler.roofline import known_bandwidth, measure_copy_bandwidth, roofline
    copy_bw = None
    if cuda and measure_bandwidth:
        try:
            copy_bw = measure_copy_bandwidth(torch, device)
        except RuntimeError:
            copy_bw = None
    if bandwidth_gbs is not None:
        bw, source = float(bandwidth_gbs) * 1e9, "given (--bandwidth-gbs)"
    elif cuda and known_bandwidth(dev_name):
        bw, label = known_bandwidth(dev_name)
        source = f"spec sheet: {label} ({bw / 1e12:g} TB/s)"
    elif copy_bw:
        bw, source = copy_bw, "measured device-to-device copy"
    else:
        return None
    return roofline(batch_sizes=[s.batch_size for s in stats], median_ms=[s.median_ms for s in stats],
                    weight_bytes=weight_bytes, input_embedding_bytes=input_embedding_bytes,
                    kv_bytes_per_token=kv_bytes_per_token, context_tokens=context, new_tokens=T,
                    bandwidth_bytes_per_s=bw, bandwidth_source=source, copy_bandwidth_bytes_per_s=copy_bw)


def _cpu_name() -> str:
    import platform
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", "r") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu ({name}, {os.cpu_count()} cores)"
