"""Unit tables shared by every package: bytes per element of the dtypes a model or KV cache is stored in."""

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}

GIB = 1024 ** 3


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int | None:
    """KV heads one of ``tp`` tensor-parallel ranks keeps: an even share, or one replica each when there are
    more ranks than heads; None when ``tp`` neither divides nor is a multiple of ``kv_heads``."""
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    return None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV-cache bytes of one token: K and V (2) x layers x KV heads x head dim x bytes per element (the one
    formula of the KV plan, the ShadowPrefill latency model, the profiler and the runtime)."""
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * int(dtype_bytes)


class KVLayout:
    """The KV-cache sizes of a model record, whole and per tensor-parallel rank (the KV plan's footprint and the
    ShadowPrefill latency model's architecture both are one).  A record names the fields that hold its layers,
    KV heads, head dim and KV bytes per element in ``_KV_FIELDS``, and in ``_KV_REFUSAL`` the error type and
    message (``{name}``, ``{tp}``, ``{kv_heads}``) for a degree that neither divides nor is a multiple of its KV
    heads."""

    __slots__ = ()
    _KV_FIELDS: tuple[str, str, str, str]
    _KV_REFUSAL: tuple[type[Exception], str]

    def _kv_dims(self) -> tuple[int, int, int, int]:
        return tuple(getattr(self, k) for k in self._KV_FIELDS)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer and every KV head, one token, whole model (bytes)."""
        return kv_bytes_per_token(*self._kv_dims())

    def kv_heads_per_gpu(self, tp: int) -> int:
        kv_heads = self._kv_dims()[1]
        share = kv_heads_per_gpu(kv_heads, tp)  # more ranks than heads: a replica each
        if share is None:
            error, message = self._KV_REFUSAL
            raise error(message.format(name=self.name, tp=tp, kv_heads=kv_heads))
        return share

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        layers, _, head_dim, nbytes = self._kv_dims()
        return kv_bytes_per_token(layers, self.kv_heads_per_gpu(tp), head_dim, nbytes)


def finite_number(x, *, error: type[Exception], unreadable: str, not_finite: str,
                  catch: tuple[type[Exception], ...] = (TypeError, ValueError)) -> float:
    """``float(x)`` when it is finite; else ``error(unreadable)`` when ``float`` raises one of ``catch``, or
    ``error(not_finite)`` for nan and inf.  The messages are whole: each caller names the value its own way."""
    import math
    try:
        v = float(x)
    except catch:
        raise error(unreadable) from None
    if not math.isfinite(v):
        raise error(not_finite)
    return v


def positive_number(text: str, *, error: type[Exception], not_a_number: str, not_positive: str) -> float:
    """``float(text)`` when it is a finite number > 0 (a flag's value: ms, requests/s, ...); else ``error``
    with ``not_a_number`` or ``not_positive`` (which name the flag and its unit) followed by
    ``, got 'TEXT'``."""
    got = f", got {text!r}"
    v = finite_number(text, error=error, unreadable=not_a_number + got, not_finite=not_positive + got,
                      catch=(ValueError,))
    if not v > 0:
        raise error(not_positive + got)
    return v


__all__ = ["DTYPE_BYTES", "GIB", "KVLayout", "kv_bytes_per_token", "kv_heads_per_gpu", "finite_number", "positive_number"]
