"""The runtime's torch executor on CPU with tiny random Qwen3 models: the step's logits against a full-prefix
forward of the transformers implementation, caches against a from-scratch recomputation after a routed run,
thresholds obeyed, slots recycled.  No timing is asserted (steps run on the runtime's virtual clock)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tr_model  # noqa: E402
from tr_model.serving.runtime import measure_closed_loop  # noqa: E402
from tr_model.serving.runtime.torch_executor import (SlotModel, TorchExecutor, profile_step_latency,  # noqa: E402
                                             random_weights, tiny_shape, weights_from_state_dict)


def _hf_model(shape, seed):
    cfg = transformers.Qwen3Config(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                                   intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
                                   num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                                   head_dim=shape.head_dim, rope_theta=shape.rope_theta, max_position_embeddings=512,
                                   tie_word_embeddings=shape.tie_word_embeddings, rms_norm_eps=shape.rms_norm_eps)
    torch.manual_seed(seed)
    m = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so that a norm applied to the wrong axis shows
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return m


def _reference_logits(hf, tokens):
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def test_steps_match_a_full_prefix_forward_of_the_reference_model():
    shape = tiny_shape(hidden=64, layers=2, vocab_size=97)
    hf = _hf_model(shape, seed=3)
    sm = SlotModel(shape, weights_from_state_dict(hf.state_dict(), shape), n_slots=3, max_len=40, t_buckets=(1, 2, 4))
    g = torch.Generator().manual_seed(0)
    seqs = {s: torch.randint(0, 97, (30,), generator=g).tolist() for s in range(3)}
    # per slot, the sequence is fed in chunks of varying length (a prompt, decodes, catch-up extends); rows of one
    # step have different start positions and lengths (right padding), as in a routed batch
    plan = [{0: 5, 1: 1, 2: 7}, {0: 1, 1: 3}, {0: 4, 2: 1}, {1: 1, 2: 2, 0: 1}, {2: 6, 0: 1}]
    done = {s: 0 for s in seqs}
    for step in plan:
        rows = [(s, done[s], seqs[s][done[s]:done[s] + n]) for s, n in step.items()]
        ids, info, logits = sm.run(rows, return_logits=True)
        assert info["batch_size"] == len(rows) and info["tokens"] == max(step.values())
        for k, (s, n) in enumerate(step.items()):
            done[s] += n
            ref = _reference_logits(hf, seqs[s][:done[s]])
            torch.testing.assert_close(logits[k], ref, atol=2e-4, rtol=2e-4)
            assert ids[k] == int(ref.argmax())
    # the graph-free path of run() without logits gives the same next tokens
    ids2, _ = sm.run([(0, done[0] - 1, [seqs[0][done[0] - 1]])])
    assert ids2[0] == int(_reference_logits(hf, seqs[0][:done[0]]).argmax())
    with pytest.raises(RuntimeError, match="max_len"):
        sm.run([(0, 38, [1, 2, 3])])
    with pytest.raises(ValueError, match="slot"):
        sm.run([(3, 0, [1])])


class _KeepingExecutor(TorchExecutor):
    """Remembers every request it served (to inspect the live ones' caches after the run)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = {}

    async def step(self, model, batch):
        for r in batch:
            self.seen[r.rid] = r
        return await super().step(model, batch)


def _recomputed_cache(shape, weights, tokens, max_len):
    fresh = SlotModel(shape, weights, n_slots=1, max_len=max_len, t_buckets=(1,))
    fresh.run([(0, 0, tokens)])
    n = len(tokens)
    return fresh.k_cache[:, 0, :n], fresh.v_cache[:, 0, :n]


def test_routed_run_keeps_every_cache_equal_to_a_recomputation():
    shapes = [tiny_shape(hidden=32, layers=1, vocab_size=101), tiny_shape(hidden=64, layers=2, vocab_size=101)]
    weights = [random_weights(s, seed=10 + k, std=0.2) for k, s in enumerate(shapes)]
    max_len = 64
    models = [SlotModel(s, w, n_slots=4, max_len=max_len, t_buckets=(1, 2, 4, 8), name=f"m{k}")
              for k, (s, w) in enumerate(zip(shapes, weights))]
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    ex = _KeepingExecutor(models, virtual_latency_ms=spec.latency_ms)
    B = (1, 2)
    r = measure_closed_loop(spec, 4, B, ex, duration_s=1.5, warmup_s=0.1, max_output_tokens=20, prompt_len=6,
                            seed=2, clock="virtual")
    ex.close()
    assert r.tokens > 0 and r.finished_requests > 0
    assert r.min_batch_size[1] >= B[1]                       # delayed batching: model 1 never launched below B1
    log = ex.step_log
    assert all(s["batch_size"] >= B[1] for s in log if s["model"] == 1)
    # catch-up: the large model's steps feed the tokens committed elsewhere, so some feed more than one per row
    assert any(s["new_tokens"] > s["batch_size"] for s in log if s["model"] == 1)
    assert all(s["new_tokens"] == s["batch_size"] for s in log if s["model"] == 0 and s["tokens"] == 1)
    live = [q for q in ex.seen.values() if q.state != "finished"]
    finished = [q for q in ex.seen.values() if q.state == "finished"]
    assert live and finished
    # finished requests gave their slots back; live ones hold distinct slots on each model
    assert all(not q.executor_state for q in finished)
    for m in range(2):
        held = [q.executor_state[("slot", m)] for q in live if ("slot", m) in q.executor_state]
        assert len(held) == len(set(held)) and len(held) + len(ex.free[m]) == 4
    checked = 0
    for q in live:
        assert q.committed <= 20 and len(q.token_ids) == q.prompt_len + q.committed
        for m in range(2):
            if ("slot", m) not in q.executor_state:
                continue
            n = q.executor_state[("len", m)]
            slot = q.executor_state[("slot", m)]
            assert 1 <= n <= len(q.token_ids)
            k_ref, v_ref = _recomputed_cache(shapes[m], weights[m], q.token_ids[:n], max_len)
            torch.testing.assert_close(models[m].k_cache[:, slot, :n], k_ref, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(models[m].v_cache[:, slot, :n], v_ref, atol=1e-5, rtol=1e-4)
            checked += 1
    assert checked >= 3


def test_table_lookup_trace_routing_and_profiling_helpers():
    from simulator.traces import generate_trace
    from tr_model.serving.runtime import TraceRouter
    from tr_model.thresholds import ThresholdTable
    shape = tiny_shape(hidden=32, layers=1, vocab_size=64)
    models = [SlotModel(shape, random_weights(shape, seed=k), n_slots=3, max_len=200, t_buckets=(1, 2, 4))
              for k in range(2)]
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    table = ThresholdTable.from_dict({
        "schema_version": 1, "num_models": 2, "max_concurrency": 3, "complete": True,
        "fallback_thresholds": [1, 1],
        "entries": [{"active_requests": n, "thresholds": [1, min(n, 2)]} for n in (1, 2, 3)]})
    trace = generate_trace(spec, 20, 12, seed=1, end_at_entry=True)
    ex = TorchExecutor(models, virtual_latency_ms=spec.latency_ms)
    r = measure_closed_loop(spec, 3, table, ex, duration_s=2.0, warmup_s=0.0, max_output_tokens=10 ** 6,
                            router=TraceRouter(trace), prompt_len=3, clock="virtual")
    ex.close()
    assert r.tokens > 0 and r.finished_requests > 0
    # B1 is looked up with model 1's live view of the active count (finishes dip it below 3 for a moment)
    lo, hi = r.active_view_range[1]
    assert 1 <= lo <= hi == 3
    assert r.min_batch_size[1] >= min(table.lookup(v)[1] for v in range(lo, hi + 1))
    prof = profile_step_latency(models[1], [1, 2, 3], new_tokens=2, context=20, steps=2, warmup=1, other=models[0])
    assert sorted(prof) == [1, 2, 3] and all(ms > 0 for ms in prof.values())


@pytest.mark.gpu
def test_cuda_graph_steps_equal_eager_steps_and_serve_a_routed_run():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    shape = tiny_shape(hidden=64, layers=2, vocab_size=128)
    w = random_weights(shape, device="cuda", seed=5, std=0.2)
    graphed = SlotModel(shape, w, n_slots=3, max_len=48, t_buckets=(1, 2, 4), device="cuda", cuda_graphs=True)
    eager = SlotModel(shape, w, n_slots=3, max_len=48, t_buckets=(1, 2, 4), device="cuda", cuda_graphs=False)
    assert len(graphed.graphs) == 3 * 3 and not eager.graphs
    g = torch.Generator().manual_seed(1)
    seqs = {s: torch.randint(0, 128, (30,), generator=g).tolist() for s in range(3)}
    done = {s: 0 for s in seqs}
    for step in [{0: 3, 1: 1, 2: 4}, {0: 1, 1: 2}, {2: 1, 0: 4, 1: 1}, {1: 3}]:
        rows = [(s, done[s], seqs[s][done[s]:done[s] + n]) for s, n in step.items()]
        a, ia = graphed.run(rows)
        b, ib = eager.run(rows)
        assert ia["graph"] and not ib["graph"] and a == b
        for s, n in step.items():
            done[s] += n
    for s in seqs:
        torch.testing.assert_close(graphed.k_cache[:, s, :done[s]], eager.k_cache[:, s, :done[s]])
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    small = SlotModel(tiny_shape(hidden=32, layers=1, vocab_size=128), random_weights(
        tiny_shape(hidden=32, layers=1, vocab_size=128), device="cuda", seed=6), n_slots=3, max_len=48,
        t_buckets=(1, 2, 4, 8), device="cuda")
    big = SlotModel(shape, w, n_slots=3, max_len=48, t_buckets=(1, 2, 4, 8), device="cuda")
    ex = TorchExecutor([small, big])
    r = measure_closed_loop(spec, 3, (1, 2), ex, duration_s=1.0, warmup_s=0.2, max_output_tokens=30,
                            prompt_len=4)
    ex.close()
    assert r.tokens > 0 and r.min_batch_size[1] >= 2
    assert sum(s["graph"] for s in ex.step_log) > 0.5 * len(ex.step_log)


def test_shapes_of_the_project_configs_match_the_profiles_byte_counts():
    import os
    from tr_model.serving.runtime.torch_executor import Qwen3Shape, load_shape
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    small = load_shape(os.path.join(root, "data", "models", "Qwen3-0.6B", "config.json"))
    large = load_shape(os.path.join(root, "data", "models", "Qwen3-32B", "config.json"))
    # the H200 profiles' weight_bytes and kv_bytes_per_token, computed there from the transformers models
    assert small.weight_bytes() == 1_192_099_840 and small.kv_bytes_per_token() == 114_688
    assert large.weight_bytes() == 65_524_246_528 and large.kv_bytes_per_token() == 262_144
    assert small.tie_word_embeddings and not large.tie_word_embeddings and small.head_dim == 128
    # transformers 5 keeps rope_theta in rope_parameters
    d = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "rope_parameters": {"rope_theta": 5000.0}}
    assert Qwen3Shape.from_config(d).rope_theta == 5000.0 and Qwen3Shape.from_config(d).head_dim == 4
