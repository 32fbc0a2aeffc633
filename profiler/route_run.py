"""Run a real token-level routing policy over a model set and record its routing trace.

Each prompt is one request; every forward pass of one model on one request is
one decoding step (a line of the trace).  Each model keeps its own KV cache of
the request; when control comes to model i it first absorbs the tokens
committed since it last ran (an extend over the peer's tokens: the handoff
path), then proposes the next token from its last-position distribution
``p = softmax(logits)``.

Policies (Table 1 of the TokenRouter paper):

* ``entropy`` (R-Stitch, 2 models): with the normalised entropy
  ``H(p) / ln V``, model 0 hands the step to model 1 when it exceeds ``tau``
  (its proposal is discarded: 0 tokens committed, the peer regenerates it);
  model 1 commits its token and hands control back when the entropy is
  ``<= tau``, else keeps it.
* ``confidence`` (CITER style, 2 models): model 0 escalates when
  ``max p < tau`` (proposal discarded); model 1 commits one token and always
  returns control to model 0.
* ``ensemble`` (ME, M >= 2 models): every step commits the current model's
  token, then the next model is drawn from ``weights``.

Tokens are chosen greedily (``temperature = 0``) or sampled at
``temperature`` with a seeded generator.  A request stops after
``max_new_tokens`` committed tokens or when ``eos_token_id`` is committed; its
last step is recorded with ``next_model = -1``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from profiler.latency import ProfileError, _forward_kwargs, _text_config, _torch
from profiler.trace import RoutingTraceRecorder

POLICIES = ("entropy", "confidence", "ensemble")

__all__ = ["POLICIES", "RouteRunResult", "run_routing_policy", "load_prompts", "shared_vocab_size"]


@dataclass(frozen=True)
class RouteRunResult:
    requests: int
    steps: int
    committed_tokens: int
    steps_per_model: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]  # committed token ids per request


def shared_vocab_size(models: Sequence[Any], allow_mismatch: bool = False) -> int:
    sizes = [int(getattr(_text_config(m.config), "vocab_size", 0) or 0) for m in models]
    if any(v <= 0 for v in sizes):
        raise ProfileError("every model config needs a vocab_size")
    if len(set(sizes)) > 1 and not allow_mismatch:
        raise ProfileError(f"models have different vocabularies (vocab_size {', '.join(map(str, sizes))}); token "
                           f"routing needs a shared tokenizer (pass --common-vocab to compare only the first "
                           f"{min(sizes)} logits when the tokenizers agree on them)")
    return min(sizes)


def load_prompts(path: str, tokenizer_path: str | None, vocab: int) -> list[list[int]]:
    """Prompts from JSONL: ``{"input_ids": [...]}``, ``{"text": "..."}``, a bare id list or a bare string."""
    from tr_core.fileio import decode_json, read_text
    lines = read_text(path, "prompts file", error=ProfileError, max_bytes=None).split("\n")
    tok = None
    out: list[list[int]] = []
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{k}"
        obj = decode_json(line, where, "prompt", error=ProfileError, loads=json.loads)
        if isinstance(obj, dict):
            if "input_ids" in obj:
                obj = obj["input_ids"]
            elif "text" in obj:
                obj = obj["text"]
            else:
                raise ProfileError(f"{where}: a prompt object needs \"input_ids\" or \"text\"")
        if isinstance(obj, str):
            if tok is None:
                if not tokenizer_path:
                    raise ProfileError(f"{where}: text prompts need --tokenizer PATH (a local tokenizer folder)")
                _, transformers = _torch()
                try:
                    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
                except (OSError, ValueError) as e:
                    raise ProfileError(f"cannot load tokenizer from {tokenizer_path!r}: "
                                       f"{str(e).splitlines()[0]}") from None
            ids = list(tok(obj)["input_ids"])
        elif isinstance(obj, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in obj):
            ids = obj
        else:
            raise ProfileError(f"{where}: a prompt must be a list of token ids or a string")
        if not ids:
            raise ProfileError(f"{where}: empty prompt")
        bad = [v for v in ids if v < 0 or v >= vocab]
        if bad:
            raise ProfileError(f"{where}: token id {bad[0]} outside the shared vocabulary 0..{vocab - 1}")
        out.append([int(v) for v in ids])
    if not out:
        raise ProfileError(f"prompts file {path!r} holds no prompts")
    return out


def _check_positions(models: Sequence[Any], prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """Refuse, before any work, a generation that runs past a model's positions (it would fail, or silently
    extrapolate, after minutes of generating)."""
    longest = max((len(p) for p in prompts), default=0)
    for k, m in enumerate(models):
        limit = getattr(_text_config(getattr(m, "config", None)), "max_position_embeddings", None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 and longest + max_new_tokens > limit:
            raise ProfileError(f"--max-new-tokens {max_new_tokens}: the longest prompt ({longest} tokens) plus "
                               f"the new tokens need {longest + max_new_tokens:,} positions, more than model {k}'s "
                               f"max_position_embeddings = {limit:,}; use --max-new-tokens <= {max(limit - longest, 0)}")


def check_policy_args(M: int, *, policy: str, tau: float | None = None, weights: Sequence[float] | None = None,
                      max_new_tokens: int = 32, temperature: float = 0.0):
    """Validate a routing policy's arguments for ``M`` models before any model is loaded or any file opened;
    returns the ensemble weights (an array) for ``ensemble``, else None.

    An argument the policy would ignore is refused naming both (``--tau`` with ``ensemble``, ``--weights``
    with ``entropy``/``confidence``)."""
    if policy not in POLICIES:
        raise ProfileError(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if M < 2:
        raise ProfileError(f"route-run needs at least 2 models, got {M}")
    if policy in ("entropy", "confidence"):
        if M != 2:
            raise ProfileError(f"--policy {policy} routes between exactly 2 models, got {M}")
        if weights is not None:
            raise ProfileError(f"--weights applies to --policy ensemble, not --policy {policy} (which routes by --tau)")
        if tau is None or not (0.0 <= tau <= 1.0):
            raise ProfileError(f"--policy {policy} needs --tau in [0, 1], got {tau}")
    w = None
    if policy == "ensemble":
        if tau is not None:
            raise ProfileError("--tau applies to --policy entropy or confidence, not --policy ensemble (which draws "
                               "the model by --weights)")
        if weights is None:
            w = np.full(M, 1.0 / M)
        else:
            w = np.asarray(list(weights), dtype=np.float64)
            if w.size != M or np.any(w < 0) or not np.isfinite(w).all() or abs(w.sum() - 1.0) > 1e-9:
                raise ProfileError(f"--weights must be {M} non-negative numbers summing to 1, got {list(weights)}")
    if max_new_tokens < 1:
        raise ProfileError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not (temperature >= 0) or not math.isfinite(temperature):
        raise ProfileError(f"--temperature must be a finite number >= 0, got {temperature}")
    return w


def run_routing_policy(models: Sequence[Any], prompts: Sequence[Sequence[int]], *, policy: str,
                       tau: float | None = None, weights: Sequence[float] | None = None,
                       max_new_tokens: int = 32, temperature: float = 0.0, seed: int = 0,
                       eos_token_id: int | None = None, recorder: RoutingTraceRecorder | None = None,
                       device: str = "cpu", common_vocab: bool = False) -> RouteRunResult:
    """Generate every prompt under ``policy`` and record each step (see module docstring)."""
    M = len(models)
    w = check_policy_args(M, policy=policy, tau=tau, weights=weights, max_new_tokens=max_new_tokens,
                          temperature=temperature)
    V = shared_vocab_size(models, common_vocab)
    _check_positions(models, prompts, max_new_tokens)
    torch, transformers = _torch()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    kws = [_forward_kwargs(m) for m in models]
    logV = math.log(V)
    total_steps = 0
    committed = 0
    per_model = [0] * M
    outputs = []
    for rid, prompt in enumerate(prompts):
        seq = list(prompt)
        caches = [transformers.DynamicCache() for _ in range(M)]
        fed = [0] * M
        last_logits: list = [None] * M
        cur, step, new_tokens = 0, 0, 0
        max_steps = 4 * max_new_tokens + 8
        while True:
            cache_kw, extra = kws[cur]
            if fed[cur] < len(seq):
                ids = torch.tensor([seq[fed[cur]:]], dtype=torch.long, device=device)
                with torch.inference_mode():
                    out = models[cur](input_ids=ids, **{cache_kw: caches[cur]}, **extra)
                last_logits[cur] = out.logits[0, -1, :V].float().cpu()
                fed[cur] = len(seq)
            logits = last_logits[cur]
            probs = torch.softmax(logits, dim=-1)
            if temperature == 0:
                token = int(torch.argmax(logits))
            else:
                token = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen))
            commit = True
            if policy == "entropy":
                ent = float(-(probs * torch.log(probs.clamp_min(1e-30))).sum()) / logV
                if cur == 0:
                    nxt = 1 if ent > tau else 0
                    commit = nxt == 0
                else:
                    nxt = 0 if ent <= tau else 1
            elif policy == "confidence":
                if cur == 0:
                    nxt = 1 if float(probs.max()) < tau else 0
                    commit = nxt == 0
                else:
                    nxt = 0
            else:
                nxt = int(rng.choice(M, p=w))
            ntok = 0
            if commit:
                seq.append(token)
                new_tokens += 1
                ntok = 1
            done = commit and (new_tokens >= max_new_tokens or (eos_token_id is not None and token == eos_token_id))
            if step + 1 >= max_steps:
                done = True
            if recorder is not None:
                recorder.record(rid, step, cur, -1 if done else nxt, ntok)
            per_model[cur] += 1
            total_steps += 1
            committed += ntok
            step += 1
            if done:
                break
            cur = nxt
        outputs.append(tuple(seq[len(prompt):]))
    return RouteRunResult(len(prompts), total_steps, committed, tuple(per_model), tuple(outputs))

