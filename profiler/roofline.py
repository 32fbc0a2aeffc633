"""Memory-bandwidth roofline of a decode or extend step: the time below which no engine can go.

A decode step of a dense transformer at small batch sizes is bound by memory
traffic: every weight is read once per step, and every request reads its K and
V.  Per step at batch size b, context c and T new tokens per request:

    bytes(b) = W_read + b (c + T) kv,      floor(b) = bytes(b) / BW,

with ``W_read`` the weight bytes minus an untied input-embedding table (a step
gathers only b T of its rows; a tied table is read in full as the output
projection), ``kv`` the KV bytes per token (2 x layers x KV heads x head dim x
dtype bytes) and ``BW`` the device's memory bandwidth.  The ratio
``measured / floor`` says how far a figure is from what the memory allows: near
1 the step is the model's bandwidth cost; much above 1 it is launch overhead,
a poor kernel, or traffic the model does not need (an expanded KV copy, a
materialised mask).  Compute is ignored: at b <= 64 a bf16 GEMM on a current
GPU is far below its FLOP ceiling.

``BW`` comes, in this order, from the user (``--bandwidth-gbs``), a table of
published peak bandwidths matched on the device name (:data:`KNOWN_GPUS`), or a
measured device-to-device copy (bytes read + bytes written over the copy's
time, a practical ceiling about 85-92% of the peak).  The copy figure is also
kept beside a table value when it was measured.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

__all__ = ["KNOWN_GPUS", "known_bandwidth", "step_bytes", "roofline", "input_embedding_bytes_from_config",
           "measure_copy_bandwidth", "profile_roofline"]

# (label, peak memory bandwidth in bytes/s[, pattern on the device name]); without a pattern, each word of the
# label must appear in the name, in that order.  First match wins, so the more specific names come first.
# Vendor spec sheets.
_SPEC_SHEETS: tuple[tuple, ...] = (
    ("B200", 8.0e12),
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100 SXM", 3.35e12, r"\bH100\b"),  # an H100 that names no form factor is the SXM part
    ("A100 80GB PCIe", 1.935e12),
    ("A100 80GB SXM", 2.039e12, r"\bA100\b.*\b80GB\b"),
    ("A100 40GB", 1.555e12, r"\bA100\b"),
    ("L40S", 0.864e12),
    ("L40", 0.864e12),
    ("L4", 0.300e12),
    ("A10", 0.600e12, r"\bA10G?\b"),  # the A10G (AWS) is an A10
    ("RTX 4090", 1.008e12, r"\bRTX 4090\b"),
)

# (pattern on the device name, label, peak memory bandwidth in bytes/s), in matching order
KNOWN_GPUS: tuple[tuple[str, str, float], ...] = tuple(
    (row[2] if len(row) > 2 else ".*".join(rf"\b{w}\b" for w in row[0].split()), row[0], row[1])
    for row in _SPEC_SHEETS)


def known_bandwidth(device_name: str) -> tuple[float, str] | None:
    """``(bytes/s, label)`` of a device from :data:`KNOWN_GPUS`, or None."""
    for pattern, label, bw in KNOWN_GPUS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return bw, label
    return None


def step_bytes(weight_bytes_read: int, kv_bytes_per_token: int | None, batch_size: int, context_tokens: int,
               new_tokens: int) -> int:
    """Bytes one step reads: the weights once, and K/V of ``context + new`` tokens for each request."""
    kv = 0 if kv_bytes_per_token is None else int(kv_bytes_per_token)
    return int(weight_bytes_read) + int(batch_size) * (int(context_tokens) + int(new_tokens)) * kv


def input_embedding_bytes_from_config(config: Mapping[str, Any], dtype_bytes: int) -> int:
    """Bytes of an untied input-embedding table (0 when tied: the output projection reads it)."""
    from tr_core.errors import TRError
    from tr_core.model_config import read_shape, text_config

    text = text_config(config)
    if config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)):
        return 0
    try:  # the fields' one reader (tr_core.model_config)
        shape = read_shape(config, "config", require_intermediate=False)
    except TRError:
        return 0
    return shape.vocab * shape.hidden * int(dtype_bytes)


def roofline(*, batch_sizes: Sequence[int], median_ms: Sequence[float], weight_bytes: int,
             input_embedding_bytes: int, kv_bytes_per_token: int | None, context_tokens: int, new_tokens: int,
             bandwidth_bytes_per_s: float, bandwidth_source: str,
             copy_bandwidth_bytes_per_s: float | None = None) -> dict:
    """The roofline block stored in a latency profile (see the module docstring)."""
    if not (bandwidth_bytes_per_s > 0 and math.isfinite(bandwidth_bytes_per_s)):
        raise ValueError(f"memory bandwidth must be a finite number > 0, got {bandwidth_bytes_per_s!r}")
    w_read = int(weight_bytes) - int(input_embedding_bytes)
    rows = []
    for b, m in zip(batch_sizes, median_ms):
        nbytes = step_bytes(w_read, kv_bytes_per_token, b, context_tokens, new_tokens)
        floor = nbytes / bandwidth_bytes_per_s * 1e3
        rows.append({"batch_size": int(b), "bytes_read": nbytes, "floor_ms": floor,
                     "measured_over_floor": float(m) / floor if floor > 0 else None})
    return {"bandwidth_bytes_per_s": float(bandwidth_bytes_per_s), "bandwidth_source": bandwidth_source,
            "copy_bandwidth_bytes_per_s": copy_bandwidth_bytes_per_s, "weight_bytes_read": w_read,
            "input_embedding_bytes_excluded": int(input_embedding_bytes), "kv_bytes_per_token": kv_bytes_per_token,
            "context_tokens": int(context_tokens), "new_tokens": int(new_tokens), "batches": rows}


def measure_copy_bandwidth(torch: Any, device: str, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s: (read + write) bytes over the median copy time (CUDA only)."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    n = int(min(nbytes, free // 4))
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    times.sort()
    return 2.0 * n / times[len(times) // 2]


def profile_roofline(prof: Any, *, bandwidth_gbs: float | None = None, config_path: str | None = None,
                     profile_path: str | None = None) -> dict:
    """The roofline of a stored :class:`profiler.latency.LatencyProfile` (computed again when asked to).

    The bandwidth is ``bandwidth_gbs``, else the profile's own roofline figure,
    else the spec-sheet figure of its device.  The untied input embedding comes
    from the profile (``input_embedding_bytes``), else from ``config_path`` or
    the config recorded in the profile's arguments; without either it is
    counted as read (a floor lower by at most the embedding table's share).
    """
    import json
    import os

    from tr_core.errors import SpecError as ProfileError  # profiler.latency imports this module: no cycle back
    from tr_core.units import DTYPE_BYTES

    where = profile_path or prof.model
    stored = prof.roofline or {}
    if bandwidth_gbs is not None:
        bw, source = float(bandwidth_gbs) * 1e9, "given (--bandwidth-gbs)"
    elif stored.get("bandwidth_bytes_per_s"):
        bw, source = float(stored["bandwidth_bytes_per_s"]), str(stored.get("bandwidth_source", "stored"))
    elif known_bandwidth(prof.device):
        bw, label = known_bandwidth(prof.device)
        source = f"spec sheet: {label} ({bw / 1e12:g} TB/s)"
    else:
        raise ProfileError(f"{where}: no known memory bandwidth for device {prof.device!r}; pass --bandwidth-gbs")
    emb = prof.input_embedding_bytes
    if emb is None:
        cfg = config_path or (prof.arguments.get("config") if isinstance(prof.arguments, dict) else None)
        emb = 0
        if isinstance(cfg, str) and cfg:
            if os.path.isdir(cfg):
                cfg = os.path.join(cfg, "config.json")
            try:
                if not os.path.isfile(cfg):  # a FIFO or device would block: only a regular file is read
                    raise OSError(f"{cfg!r} is not a regular file")
                with open(cfg, "r", encoding="utf-8") as f:
                    d = json.load(f)
            except (OSError, ValueError, RecursionError):
                if config_path:
                    raise ProfileError(f"--config {config_path!r} is missing or not valid JSON") from None
                d = None
            if isinstance(d, dict):
                emb = input_embedding_bytes_from_config(d, DTYPE_BYTES.get(prof.dtype, 2))
    return roofline(batch_sizes=[s.batch_size for s in prof.batches], median_ms=[s.median_ms for s in prof.batches],
                    weight_bytes=prof.weight_bytes, input_embedding_bytes=emb,
                    kv_bytes_per_token=prof.kv_bytes_per_token, context_tokens=prof.context_tokens,
                    new_tokens=prof.extend_tokens, bandwidth_bytes_per_s=bw, bandwidth_source=source,
                    copy_bandwidth_bytes_per_s=stored.get("copy_bandwidth_bytes_per_s"))
