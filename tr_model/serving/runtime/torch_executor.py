"""The runtime's GPU executor: Qwen3 decoding with per-model slot KV caches, catch-up extends and CUDA graphs.

This is the only module of ``tr_model`` that imports torch (``tr_model.serving.runtime``
loads it lazily).  It runs the Qwen3 architecture itself on weight tensors
(random, or taken from a Hugging Face model's state dict), so that the cache
layout, the step shapes and the graph capture are under its control and do not
depend on a transformers version.

**Caches.**  Each model holds, for ``n_slots`` request slots, preallocated key
and value tensors ``[layers, n_slots, S, kv_heads, head_dim]`` with
``S = max_len + t_max`` positions (the tail absorbs the writes of padded
query positions).  A request gets a slot on a model the first time it runs
there and gives it back when it finishes.

**Catch-up.**  Model j's cache of a request covers ``token_ids[:c_j]``.  When
the request comes to j, the step feeds every token it has not seen,
``token_ids[c_j:]`` (the tokens committed elsewhere since it last ran on j,
and at the first visit the prompt as well), in one forward pass, and the
logits of the last of them give the next token.  A request that stays on j
feeds exactly one token (a plain decode); in R2R the large model's steps are
extends of ``k + 1`` tokens, k the small model's accepted tokens in between.
With nothing new (a model returning to itself with no committed token) the
last token is fed again (its cache entry is overwritten with the same values).

**A step** of a batch of b rows with ``n_r`` new tokens each is one forward
pass of shape ``[b, T]``, ``T = max n_r`` rounded up to a bucket of
``t_buckets`` (rows right-padded); row r's query t sits at position
``c_r + t`` and attends to the cache positions ``<= c_r + t`` of its slot.
Attention gathers the b slots' caches and folds the query heads of a KV group
into the query length, ``[b, kv_heads, g T, head_dim]`` against
``[b, kv_heads, S, head_dim]``, so grouped-query attention needs no copy of
K/V per query head.  The step cost therefore depends on (b, T, S), not on
the requests' current lengths: ``L_i(b)`` is stationary by construction.

**CUDA graphs** (CUDA only): one graph per (b, T) for b = 1..n_slots and T in
``t_buckets``, captured at start on a private stream into one memory pool per
model; a step copies one packed int64 block (ids, slot, start position, valid
count) to the device, replays the graph and copies the b next-token ids back.
Shapes outside the captured set run eagerly.  On CPU every step is eager.

**Streams and devices.**  Each model has its own CUDA stream (and its own
device when several are given) and its own worker thread: the asyncio event
loop hands a step to the model's thread and keeps serving the other
subservers, so two models' steps overlap on the GPU as separate processes'
would.  ``virtual_latency_ms`` instead runs the step in the loop's thread and
then sleeps that long, for functional tests on the runtime's virtual clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

__all__ = ["Qwen3Shape", "random_weights", "weights_from_state_dict", "SlotModel", "TorchExecutor",
           "tiny_shape", "load_shape", "profile_step_latency"]


@dataclass(frozen=True)
class Qwen3Shape:
    """The architecture numbers of a Qwen3 model (from a ``config.json`` or a transformers config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False

    @staticmethod
    def from_config(cfg: Any) -> "Qwen3Shape":
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
        theta = get("rope_theta")
        if theta is None:  # transformers 5 keeps it in rope_parameters
            rp = get("rope_parameters") or {}
            theta = rp.get("rope_theta", 1_000_000.0) if isinstance(rp, Mapping) else 1_000_000.0
        from tr_core.model_config import read_shape
        s = read_shape(cfg, "config")  # the fields' one reader (tr_core.model_config)
        return Qwen3Shape(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                          num_layers=s.layers, num_heads=s.heads, num_kv_heads=s.kv_heads, head_dim=s.head_dim,
                          rms_norm_eps=float(get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                          tie_word_embeddings=s.tied_embeddings)

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        from tr_core import model_config as MC
        h, hd = self.hidden_size, self.head_dim
        per_layer = (MC.attention_params(h, self.num_heads, self.num_kv_heads, hd, bias=False)
                     + MC.mlp_params(h, self.intermediate_size, gated=True) + MC.norm_params(h, hd, qk_norm=True))
        return dtype_bytes * (self.num_layers * per_layer + MC.embedding_params(self.vocab_size, h,
                                                                                self.tie_word_embeddings))

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        from tr_core.units import kv_bytes_per_token
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype_bytes)


def load_shape(path: str | os.PathLike) -> Qwen3Shape:
    """The shape of a Qwen3 ``config.json``."""
    with open(path, encoding="utf-8") as f:
        return Qwen3Shape.from_config(json.load(f))


def tiny_shape(hidden: int = 64, layers: int = 2, vocab_size: int = 256) -> Qwen3Shape:
    """A Qwen3-like shape small enough for CPU tests (GQA with 2 query heads per KV head, q/k norms, SwiGLU)."""
    heads = max(2, hidden // 16)
    return Qwen3Shape(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                      num_heads=heads, num_kv_heads=max(1, heads // 2), head_dim=hidden // heads, rope_theta=10000.0,
                      tie_word_embeddings=True)


def _layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    return {"in_norm": p + "input_layernorm.weight", "q": p + "self_attn.q_proj.weight",
            "k": p + "self_attn.k_proj.weight", "v": p + "self_attn.v_proj.weight",
            "q_norm": p + "self_attn.q_norm.weight", "k_norm": p + "self_attn.k_norm.weight",
            "o": p + "self_attn.o_proj.weight", "post_norm": p + "post_attention_layernorm.weight",
            "gate": p + "mlp.gate_proj.weight", "up": p + "mlp.up_proj.weight", "down": p + "mlp.down_proj.weight"}


def random_weights(shape: Qwen3Shape, *, device: Any = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                   std: float = 0.02) -> dict[str, torch.Tensor]:
    """Random weights under Hugging Face's state-dict names, generated on ``device`` (fast for 32B on a GPU)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hd, i = shape.hidden_size, shape.head_dim, shape.intermediate_size

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    w = {"model.embed_tokens.weight": mat(shape.vocab_size, h), "model.norm.weight": ones(h)}
    for k in range(shape.num_layers):
        n = _layer_names(k)
        w.update({n["in_norm"]: ones(h), n["post_norm"]: ones(h), n["q_norm"]: ones(hd), n["k_norm"]: ones(hd),
                  n["q"]: mat(shape.num_heads * hd, h), n["k"]: mat(shape.num_kv_heads * hd, h),
                  n["v"]: mat(shape.num_kv_heads * hd, h), n["o"]: mat(h, shape.num_heads * hd),
                  n["gate"]: mat(i, h), n["up"]: mat(i, h), n["down"]: mat(h, i)})
    if not shape.tie_word_embeddings:
        w["lm_head.weight"] = mat(shape.vocab_size, h)
    return w


def weights_from_state_dict(state: Mapping[str, torch.Tensor], shape: Qwen3Shape) -> dict[str, torch.Tensor]:
    """The tensors this module uses, taken from a Hugging Face Qwen3 state dict (missing names raise KeyError)."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for k in range(shape.num_layers):
        names += list(_layer_names(k).values())
    w = {n: state[n].detach() for n in names}
    if not shape.tie_word_embeddings:
        w["lm_head.weight"] = state["lm_head.weight"].detach()
    return w


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the reference order: normalise in float32, cast back, then scale
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class SlotModel:
    """One model with its slot KV caches and captured step graphs; ``run`` does one (catch-up) step.

    ``run(rows)``: rows of ``(slot, start, tokens)``; feeds ``tokens`` at
    positions ``start, start + 1, ...`` of ``slot`` and returns the greedy next
    token of every row (and, with ``return_logits=True``, the last position's
    logits as a float32 CPU tensor ``[b, vocab]``).
    """

    def __init__(self, shape: Qwen3Shape, weights: Mapping[str, torch.Tensor], *, n_slots: int, max_len: int,
                 t_buckets: Sequence[int] = (1, 2, 4, 8, 16), device: Any = "cpu", dtype: torch.dtype | None = None,
                 cuda_graphs: bool | None = None, graph_batch_sizes: Sequence[int] | None = None,
                 name: str = "model"):
        if n_slots < 1 or max_len < 2:
            raise ValueError(f"n_slots must be >= 1 and max_len >= 2, got {n_slots}, {max_len}")
        self.shape, self.name = shape, name
        self.device = torch.device(device)
        self.dtype = dtype or next(iter(weights.values())).dtype
        self.w = {k: v.to(device=self.device, dtype=self.dtype) for k, v in weights.items()}
        self.layers = [{k: self.w[n] for k, n in _layer_names(i).items()} for i in range(shape.num_layers)]
        self.lm_head = self.w["model.embed_tokens.weight"] if shape.tie_word_embeddings else self.w["lm_head.weight"]
        self.n_slots, self.max_len = int(n_slots), int(max_len)
        self.t_buckets = tuple(sorted({int(t) for t in t_buckets}))
        if not self.t_buckets or self.t_buckets[0] < 1:
            raise ValueError(f"t_buckets must be integers >= 1, got {list(t_buckets)}")
        self.t_max = self.t_buckets[-1]
        # the cache length is a multiple of 64 (aligned attention masks) with room for padded writes
        self.S = -(-(self.max_len + self.t_max) // 64) * 64
        hd = shape.head_dim
        with torch.inference_mode():
            kv = (shape.num_layers, self.n_slots, self.S, shape.num_kv_heads, hd)
            self.k_cache = torch.zeros(kv, device=self.device, dtype=self.dtype)
            self.v_cache = torch.zeros(kv, device=self.device, dtype=self.dtype)
            inv = 1.0 / (shape.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
            freqs = torch.outer(torch.arange(self.S, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos = emb.cos().to(device=self.device, dtype=self.dtype)
            self.sin = emb.sin().to(device=self.device, dtype=self.dtype)
            self.key_pos = torch.arange(self.S, device=self.device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.capture_s = 0.0
        if cuda_graphs is None:
            cuda_graphs = self.cuda
        if cuda_graphs:
            if not self.cuda:
                raise ValueError("CUDA graphs need a CUDA device")
            self.capture_graphs(graph_batch_sizes or range(1, self.n_slots + 1))

    # ---- the forward pass -------------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, slots: torch.Tensor, start: torch.Tensor, n_valid: torch.Tensor,
                want_logits: bool = False):
        """One step on device tensors: ids ``[b, T]``, slots/start/n_valid ``[b]``; returns next ids (and logits)."""
        sh = self.shape
        b, T = ids.shape
        hd, kvh = sh.head_dim, sh.num_kv_heads
        g = sh.num_heads // kvh
        qpos = start[:, None] + torch.arange(T, device=ids.device)[None, :]            # [b, T]
        cos, sin = self.cos[qpos][:, :, None, :], self.sin[qpos][:, :, None, :]       # [b, T, 1, hd]
        mask = self.key_pos[None, None, :] <= qpos[:, :, None]                         # [b, T, S]
        mask = mask[:, None, None].expand(b, 1, g, T, self.S).reshape(b, 1, g * T, self.S)
        widx = (slots[:, None].expand(b, T), qpos)
        x = F.embedding(ids, self.w["model.embed_tokens.weight"])
        for li, L in enumerate(self.layers):
            h = _rms_norm(x, L["in_norm"], sh.rms_norm_eps)
            q = _rms_norm(F.linear(h, L["q"]).view(b, T, sh.num_heads, hd), L["q_norm"], sh.rms_norm_eps)
            k = _rms_norm(F.linear(h, L["k"]).view(b, T, kvh, hd), L["k_norm"], sh.rms_norm_eps)
            v = F.linear(h, L["v"]).view(b, T, kvh, hd)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc.index_put_(widx, k)
            vc.index_put_(widx, v)
            ks = kc.index_select(0, slots).transpose(1, 2)                              # [b, kvh, S, hd]
            vs = vc.index_select(0, slots).transpose(1, 2)
            qf = q.view(b, T, kvh, g, hd).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * T, hd)
            a = F.scaled_dot_product_attention(qf, ks, vs, attn_mask=mask, scale=hd ** -0.5)
            a = a.view(b, kvh, g, T, hd).permute(0, 3, 1, 2, 4).reshape(b, T, sh.num_heads * hd)
            x = x + F.linear(a, L["o"])
            h = _rms_norm(x, L["post_norm"], sh.rms_norm_eps)
            x = x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])
        last = x[torch.arange(b, device=ids.device), n_valid - 1]                      # [b, hidden]
        logits = F.linear(_rms_norm(last, self.w["model.norm.weight"], sh.rms_norm_eps), self.lm_head).float()
        nxt = logits.argmax(dim=-1)
        return (nxt, logits) if want_logits else nxt

    # ---- CUDA graphs ------------------------------------------------------------------------------------------
    def _packed_views(self, buf: torch.Tensor, b: int, T: int):
        blk = buf[:b]
        return blk[:, :T], blk[:, T], blk[:, T + 1], blk[:, T + 2]

    def capture_graphs(self, batch_sizes: Sequence[int]) -> None:
        """Capture one graph per (b, T) (b in ``batch_sizes``, T in ``t_buckets``) into one pool per model."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        self._static = {T: torch.zeros(self.n_slots, T + 3, dtype=torch.long, device=self.device)
                        for T in self.t_buckets}
        with torch.inference_mode(), torch.cuda.device(self.device):
            for T in self.t_buckets:
                buf = self._static[T]
                buf[:, T + 2] = 1  # valid count 1, slot 0, start 0: warm-up writes land in slot 0's first entries
                for b in sorted(set(int(x) for x in batch_sizes if 1 <= x <= self.n_slots), reverse=True):
                    views = self._packed_views(buf, b, T)
                    s = torch.cuda.Stream(device=self.device)
                    s.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(s):
                        for _ in range(2):
                            self.forward(*views)
                    torch.cuda.current_stream(self.device).wait_stream(s)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = self.forward(*views)
                    self.graphs[(b, T)] = (graph, buf, out)
            torch.cuda.synchronize(self.device)
            self.k_cache.zero_()
            self.v_cache.zero_()
        self.capture_s = time.perf_counter() - t0

    # ---- one step ---------------------------------------------------------------------------------------------
    def bucket(self, n: int) -> int | None:
        for t in self.t_buckets:
            if t >= n:
                return t
        return None

    def run(self, rows: Sequence[tuple[int, int, Sequence[int]]], return_logits: bool = False):
        """Run one step (see the class docstring); returns ``(next_ids, info)`` (and logits when asked)."""
        b = len(rows)
        n = [len(t) for _, _, t in rows]
        if b == 0 or min(n) < 1:
            raise ValueError("a step needs >= 1 row and >= 1 token per row")
        for slot, start, toks in rows:
            if not (0 <= slot < self.n_slots):
                raise ValueError(f"{self.name}: slot {slot} outside 0..{self.n_slots - 1}")
            if start + len(toks) > self.max_len:
                raise RuntimeError(f"{self.name}: a request reached {start + len(toks)} tokens, more than the "
                                   f"cache's max_len = {self.max_len}; raise max_len")
        Tb = self.bucket(max(n))
        graph = None if (return_logits or Tb is None) else self.graphs.get((b, Tb))
        T = Tb if graph is not None else max(n)
        host = torch.zeros(b, T + 3, dtype=torch.long)
        for r, (slot, start, toks) in enumerate(rows):
            host[r, :len(toks)] = torch.as_tensor(list(toks), dtype=torch.long)
            host[r, T], host[r, T + 1], host[r, T + 2] = slot, start, len(toks)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ctx = torch.cuda.stream(self.stream) if self.cuda else _nullcontext()
            with ctx:
                if graph is not None:
                    g, buf, out = graph
                    buf[:b].copy_(host, non_blocking=False)
                    g.replay()
                    nxt = out.to("cpu")
                    logits = None
                else:
                    dev = host.to(self.device)
                    res = self.forward(*self._packed_views(dev, b, T), want_logits=return_logits)
                    nxt, logits = (res if return_logits else (res, None))
                    nxt = nxt.to("cpu")
                    if logits is not None:
                        logits = logits.to("cpu")
                if self.cuda:
                    self.stream.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        info = {"batch_size": b, "tokens": T, "new_tokens": sum(n), "graph": graph is not None, "ms": ms}
        ids = [int(x) for x in nxt]
        return (ids, info, logits) if return_logits else (ids, info)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class TorchExecutor:
    """Step executor of :mod:`tr_model.serving.runtime` over :class:`SlotModel` s (one per subserver).

    Keeps, per request, the slot it holds on each model and how many of its
    tokens each model's cache covers (``request.executor_state``); a step
    feeds every token the model has not seen (the catch-up).  ``step_log``
    records every step: model, batch size, padded and new token counts,
    whether a graph ran, wall ms.  ``virtual_latency_ms(model, b)``: run on the
    runtime's virtual clock, each step lasting that long (functional tests).
    """

    time_scale = 1.0

    def __init__(self, models: Sequence[SlotModel], *, virtual_latency_ms: Callable[[int, int], float] | None = None):
        if not models:
            raise ValueError("TorchExecutor needs at least one model")
        self.models = list(models)
        self.virtual_latency_ms = virtual_latency_ms
        self.vocab_size = min(m.shape.vocab_size for m in self.models)
        self.free = [list(range(m.n_slots - 1, -1, -1)) for m in self.models]
        self.step_log: list[dict] = []
        self._lock = threading.Lock()
        self._pools = [concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tr-model{i}")
                       for i in range(len(self.models))]

    def _rows(self, model: int, batch: Sequence[Any]) -> list[tuple[int, int, list[int]]]:
        rows = []
        for r in batch:
            st = r.executor_state
            slot = st.get(("slot", model))
            if slot is None:
                if not self.free[model]:
                    raise RuntimeError(f"model {model} has no free cache slot (n_slots = {self.models[model].n_slots})")
                slot = self.free[model].pop()
                st[("slot", model)] = slot
                st[("len", model)] = 0
            c = st[("len", model)]
            toks = r.token_ids
            if c >= len(toks):
                c = len(toks) - 1  # nothing new since the last step here: feed the last token again
            rows.append((slot, c, list(toks[c:])))
        return rows

    def _run(self, model: int, rows, batch) -> list[int]:
        ids, info = self.models[model].run(rows)
        info["model"] = model
        with self._lock:
            self.step_log.append(info)
        return ids

    async def step(self, model: int, batch: Sequence[Any]) -> list[int]:
        rows = self._rows(model, batch)
        if self.virtual_latency_ms is not None:
            ids = self._run(model, rows, batch)
            await asyncio.sleep(self.virtual_latency_ms(model, len(batch)) / 1000.0)
        else:
            loop = asyncio.get_running_loop()
            ids = await loop.run_in_executor(self._pools[model], self._run, model, rows, batch)
        for r in batch:
            r.executor_state[("len", model)] = len(r.token_ids)
        return ids

    def release(self, request: Any) -> None:
        """Give the request's slots back (the runtime calls this when it finishes)."""
        st = request.executor_state
        for m in range(len(self.models)):
            slot = st.pop(("slot", m), None)
            st.pop(("len", m), None)
            if slot is not None:
                self.free[m].append(slot)

    def reset(self) -> None:
        """Forget every request (all slots free, log cleared): call between closed-loop runs, whose unfinished
        requests never give their slots back."""
        for pool in self._pools:  # a step of the stopped run may still be writing into its slots: let it finish
            pool.submit(lambda: None).result()
        self.free = [list(range(m.n_slots - 1, -1, -1)) for m in self.models]
        with self._lock:
            self.step_log = []

    def latency_table(self, graph_only: bool = False) -> dict[int, dict[int, float]]:
        """Median measured step time in ms: ``{model: {batch_size: ms}}`` over the logged steps."""
        acc: dict[tuple[int, int], list[float]] = {}
        for s in self.step_log:
            if graph_only and not s["graph"]:
                continue
            acc.setdefault((s["model"], s["batch_size"]), []).append(s["ms"])
        out: dict[int, dict[int, float]] = {}
        for (m, b), v in sorted(acc.items()):
            out.setdefault(m, {})[b] = statistics.median(v)
        return out

    def close(self) -> None:
        for p in self._pools:
            p.shutdown(wait=True)


def profile_step_latency(model: SlotModel, batch_sizes: Sequence[int], *, new_tokens: int = 1, context: int = 256,
                         steps: int = 10, warmup: int = 2, other: SlotModel | None = None, other_batch: int = 1,
                         seed: int = 0) -> dict[int, float]:
    """Median wall ms of one step of b rows feeding ``new_tokens`` tokens each at position ``context``.

    The time covers what the runtime's step pays: the packed input copy, the
    graph replay (or eager pass), the synchronisation and the copy back.  With
    ``other``, that model runs decode steps of ``other_batch`` rows back to back
    in a second thread (its own stream) meanwhile: the co-running latency.
    """
    if context + new_tokens > model.max_len:
        raise ValueError(f"context + new_tokens = {context + new_tokens} exceeds max_len = {model.max_len}")
    g = torch.Generator().manual_seed(seed)
    stop = threading.Event()
    runner = None
    if other is not None:
        def loop_other():
            rows = [(s, context, [1]) for s in range(min(other_batch, other.n_slots))]
            while not stop.is_set():
                other.run(rows)
        runner = threading.Thread(target=loop_other, daemon=True)
        runner.start()
    out = {}
    try:
        for b in batch_sizes:
            if b > model.n_slots:
                continue
            times = []
            for k in range(warmup + steps):
                toks = torch.randint(0, model.shape.vocab_size, (b, new_tokens), generator=g).tolist()
                _, info = model.run([(s, context, toks[s]) for s in range(b)])
                if k >= warmup:
                    times.append(info["ms"])
            out[int(b)] = statistics.median(times)
    finally:
        stop.set()
        if runner is not None:
            runner.join()
    return out
