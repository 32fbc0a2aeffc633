"""Unit tables shared by every package: bytes per element of the dtypes a model or KV cache is stored in."""

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}

GIB = 1024 ** 3

__all__ = ["DTYPE_BYTES", "GIB"]
