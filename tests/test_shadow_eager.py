"""Eager (shadow work as normal-priority requests) is not free in the simulator: its prefills cost what normal
prefills cost, in the same FIFO and the same iterations (issue 26; benchmarks/shadow_eager_cost.py measures where
that cost outweighs its switch-call gain)."""

from __future__ import annotations

import numpy as np

from shadow_prefill.cluster import _kernels as K
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.sessions import SessionSet


def _never_switching(n_sessions=30, calls=6):
    """Sessions whose every call goes to model a: any warming of model b is pure waste."""
    model, prompt, new_input, output, gap, ao, lengths = [], [], [], [], [], [], []
    for s in range(n_sessions):
        p = 6000 + 500 * (s % 7)
        for k in range(calls):
            model.append(0)
            prompt.append(p)
            new_input.append(p if k == 0 else 800)
            output.append(150)
            gap.append(1.0)
            ao.append(True)
            p += 150 + 800
        lengths.append(calls)
    return SessionSet.from_arrays(model_names=("a", "b"), lengths=lengths, model=model, prompt=prompt,
                                  new_input=new_input, output=output, gap_s=gap, append_only=ao)


def test_eager_work_is_paid_by_the_other_models_traffic():
    ss = _never_switching()
    cfg = ClusterConfig(instances=1)
    sc = Scenario(rho=0.7, warmup_s=20.0, measure_s=200.0, drain_s=600.0, session_rate=0.15, seed=3)
    base = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=(17.0, 5.5))
    eager = simulate_cluster(ss, cfg, "Eager", sc, capacity=(17.0, 5.5))
    assert eager.totals[K.G_INVARIANT_ERRORS] == 0
    # every eager token is waste: no call ever switches, so none is hit
    assert eager.totals[K.G_SHADOW_COMPUTED] > 100_000 and eager.totals[K.G_SHADOW_USED] == 0
    b_inst = eager.instance_model == 1
    assert eager.instance_stats[b_inst, K.S_PF_SHADOW].sum() > 0
    # the routed calls (all on model a, where no eager work runs) are untouched
    done = base.call_done & eager.call_done
    assert done.all()
    np.testing.assert_array_equal(base.call_finish_s, eager.call_finish_s)
    # model b's normal requests share their iterations and queue with the eager prefills: they are slower
    on_b = (base.normal_instance >= 0) & (base.instance_model[np.maximum(base.normal_instance, 0)] == 1)
    ok = on_b & (base.normal_first_token_s >= 0) & (eager.normal_first_token_s >= 0)
    ttft_b = (base.normal_first_token_s - base.normal_arrival_s)[ok].mean()
    ttft_e = (eager.normal_first_token_s - eager.normal_arrival_s)[ok].mean()
    fin_b = (base.normal_finish_s - base.normal_arrival_s)[ok].mean()
    fin_e = (eager.normal_finish_s - eager.normal_arrival_s)[ok].mean()
    assert ttft_e > 1.05 * ttft_b and fin_e > fin_b
    # and model a's normal requests are exactly as under No Shadow
    on_a = (base.normal_instance >= 0) & (base.instance_model[np.maximum(base.normal_instance, 0)] == 0)
    np.testing.assert_array_equal(base.normal_finish_s[on_a], eager.normal_finish_s[on_a])
