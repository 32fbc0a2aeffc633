"""A step executor for :mod:`tr_model.runtime` that runs a real causal-LM forward pass per step.

``TorchExecutor(models)`` holds one ``torch.nn.Module`` per subserver (any
Hugging Face causal LM, or anything returning ``.logits`` of shape
``(batch, seq, vocab)``).  One step of a batch on model i:

1. takes each request's token ids (prompt + committed tokens), keeps the last
   ``max_context`` of them, left-pads them to a common length with an
   attention mask (so every row's last position is its newest token);
2. runs the forward pass under ``torch.inference_mode`` in a worker thread
   (``asyncio.to_thread``: the event loop, and thus the other subservers,
   keep running while this model computes, as separate GPUs/processes would);
3. returns the greedy next token of every request (argmax of the last
   position's logits) and records the step's wall time, synchronising CUDA
   first so that the time covers the kernels.

The step recomputes the (windowed) prefix instead of keeping a KV cache, so
its cost depends on ``max_context``; keep the window fixed for a stationary
``L_i(b)``.  ``latency_table()`` returns the measured median step time per
(model, batch size), the input a spec's ``latency_curves`` take.

torch is imported at module import; ``tr_model.runtime.torch_executor`` loads
this module lazily (only ``profiler/`` may import torch).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Sequence

import torch

__all__ = ["TorchExecutor", "tiny_qwen3_models"]


def tiny_qwen3_models(sizes: Sequence[tuple[int, int]] = ((64, 1), (128, 2)), vocab_size: int = 512,
                      seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> list:
    """Randomly initialised Qwen3 models (transformers) of the given ``(hidden_size, layers)``.

    They have Qwen3's architecture (GQA, q/k norms, SwiGLU) at a size a CPU
    test can afford; real weights are not needed to time a step.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM
    models = []
    for k, (hidden, layers) in enumerate(sizes):
        torch.manual_seed(seed + k)
        heads = max(2, hidden // 32)
        cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                          head_dim=hidden // heads, max_position_embeddings=4096, tie_word_embeddings=True)
        m = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype)
        m.eval()
        models.append(m)
    return models


class TorchExecutor:
    """Real forward passes; ``time_scale`` is 1 (times are measured, not emulated)."""

    time_scale = 1.0

    def __init__(self, models: Sequence[Any], *, device: str | None = None, max_context: int = 32,
                 pad_token_id: int = 0):
        if not models:
            raise ValueError("TorchExecutor needs at least one model")
        if max_context < 1:
            raise ValueError(f"max_context must be >= 1, got {max_context!r}")
        self.models = list(models)
        first = next(self.models[0].parameters(), None)
        self.device = torch.device(device) if device is not None else (first.device if first is not None
                                                                      else torch.device("cpu"))
        self.max_context = int(max_context)
        self.pad = int(pad_token_id)
        self.samples: dict[tuple[int, int], list[float]] = {}
        sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in self.models]
        self.vocab_size = min(v for v in sizes if v) if any(sizes) else None  # prompts must stay inside it

    def _forward(self, model: int, seqs: list[list[int]]) -> list[int]:
        rows = [s[-self.max_context:] if s else [self.pad] for s in seqs]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[k, width - len(r):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.models[model](input_ids=ids, attention_mask=mask, position_ids=pos)
            logits = out.logits if hasattr(out, "logits") else out
            nxt = logits[:, -1, :].argmax(dim=-1)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self.samples.setdefault((model, len(rows)), []).append((time.perf_counter() - t0) * 1000.0)
        return [int(x) for x in nxt.cpu()]

    async def step(self, model: int, batch: Sequence[Any]) -> list[int]:
        seqs = [list(r.token_ids) for r in batch]
        return await asyncio.to_thread(self._forward, model, seqs)

    def latency_table(self) -> dict[int, dict[int, float]]:
        """Median measured step time in ms: ``{model: {batch_size: ms}}``."""
        out: dict[int, dict[int, float]] = {}
        for (m, b), v in sorted(self.samples.items()):
            out.setdefault(m, {})[b] = statistics.median(v)
        return out

    def close(self) -> None:
        self.samples.clear()
