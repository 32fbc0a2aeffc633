"""Reference asyncio runtime of token-level routed serving (TokenRouter, Section 4).

One :class:`Subserver` per model, each running the paper's three decoupled loops
as asyncio tasks in one event loop:

* **client loop** (entry subserver, model 0): admits new client requests into
  the local queue, announces each admission to every subserver, and completes
  the client's response when a request finishes (on any subserver);
* **decoding loop**: delayed batching -- when the model is idle and at least
  ``B_i`` requests wait, it launches one batch with all of them (up to the
  model's ``max_batch_size``), awaits the step executor, then routes every
  request: the router draws the next model ``j`` from row ``P[i]`` and commits
  ``C[i][j]`` tokens; a request that stays (``j == i``) re-joins the local
  queue, one that leaves is marked *pending* and handed to the inter-model loop;
* **inter-model loop**: sends peer requests to their destination's inbox,
  receives peer requests (they re-join the local queue as if they never left:
  the paper's handoff-and-resume) and control messages.

*Global state tracking*: ``B_i`` is looked up in the thresholds table with
the subserver's own view of the number of active requests; the view is kept
consistent by +1/-1 control messages that travel on the same peer channel
(every admission and every finish is announced to every subserver), so there
is no central coordinator.  Whenever a message changes the view or the queue,
the decoding loop re-evaluates its launch condition.

Measurement, as in the paper (Section 5.1): ``N`` closed-loop clients, each
issuing a new request as soon as its previous one completes.  After a warm-up,
throughput = committed output tokens / elapsed time; per-request speed = mean
over requests issued and finished inside the window of tokens / latency;
admission latency of model i = mean time between a request's arrival in i's
queue and the launch of the batch that takes it.  All times are divided by the
executor's ``time_scale`` so that they are in the spec's units.

Clocks: on the wall clock (``new_event_loop("wall")``) steps take real time;
on the virtual clock (:class:`VirtualTimeLoop`) every timer fires in zero wall
time exactly at its deadline, so the same code becomes a discrete-event
simulation of itself whose results are exact and repeatable (tests use it).

A finished request is replaced by a new one at the entry model.  For the
R2R/CITER/Co-LLM presets every committing step sends the request to model 0
anyway, so the closed loop is exactly the delayed-batching chain with N
requests; for other routing matrices the restart differs from the chain by
O(1 / output length).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import selectors
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Request", "MatrixRouter", "FixedThresholds", "Subserver", "TokenRouterRuntime", "RuntimeResult",
           "run_closed_loop", "measure_closed_loop", "new_event_loop", "run_in_new_loop", "VirtualTimeLoop",
           "TraceRouter"]


@dataclass(eq=False)
class Request:
    """A request's serving state; it lives in exactly one subserver queue, batch or channel at a time."""

    rid: int
    client: int
    max_output_tokens: int
    rng: random.Random
    token_ids: list = field(default_factory=list)
    committed: float = 0.0
    model: int = 0
    state: str = "waiting"  # waiting | running | pending | finished
    created_at: float = 0.0
    arrived_at: float = 0.0
    finished_at: float | None = None
    hops: int = 0
    future: Any = None
    prompt_len: int = 0
    trace_pos: int = -1          # position in a replayed routing trace (TraceRouter), -1 before the first step
    executor_state: dict = field(default_factory=dict)  # per-model cache bookkeeping of the executor
    committed_by_model: dict = field(default_factory=dict)  # model index -> tokens committed by its steps
    cancelled: bool = False      # its client is gone: finished at its next step, its slots freed


class MatrixRouter:
    """Routes by the spec's matrices: next model ``j ~ P[i]``, ``C[i][j]`` tokens committed.

    The draw uses the request's own random stream, so two runs with the same
    seed make the same routing decisions request by request (common random
    numbers: comparisons between threshold vectors are much less noisy).
    """

    def __init__(self, routing_matrix: Sequence[Sequence[float]], committed_tokens: Sequence[Sequence[float]]):
        self.C = [list(map(float, r)) for r in committed_tokens]
        self.cum = []
        for row in routing_matrix:
            acc, c = 0.0, []
            for v in row:
                acc += float(v)
                c.append(acc)
            c[-1] = math.inf  # rows sum to 1 within rounding; never fall off the end
            self.cum.append(c)

    def route(self, model: int, request: Request, token: int | None) -> tuple[int, float]:
        j = bisect.bisect_right(self.cum[model], request.rng.random())
        return j, self.C[model][j]


class TraceRouter:
    """Routes by a recorded routing trace (:class:`simulator.traces.RoutingTrace`, or a JSONL path).

    Each new request replays one recorded request, picked by its own random
    stream: after its k-th step it moves to the recorded ``model`` of step
    k + 1 and commits the recorded ``committed_tokens`` of step k; after the
    recorded last step it finishes (the closed loop then admits a new request
    at the entry model).  The runtime admits every request at model 0, so the
    recorded requests must start there.
    """

    def __init__(self, trace: Any):
        from simulator.traces import RoutingTrace, read_trace
        tr = trace if isinstance(trace, RoutingTrace) else read_trace(trace)
        starts = tr.model[tr.offsets[:-1]]
        if tr.n_requests < 1 or (starts != 0).any():
            raise ValueError("a routing trace for the runtime needs >= 1 recorded request, each starting at model 0")
        self.offsets = [int(x) for x in tr.offsets]
        self.model = [int(x) for x in tr.model]
        self.tokens = [float(x) for x in tr.committed_tokens]
        self.last = [bool(x) for x in tr.last_step_flags()]

    def route(self, model: int, request: Request, token: int | None) -> tuple[int, float]:
        if request.trace_pos < 0:
            rec = request.rng.randrange(len(self.offsets) - 1)
            request.trace_pos = self.offsets[rec]
        pos = request.trace_pos
        if self.model[pos] != model:
            raise RuntimeError(f"trace replay out of step: recorded model {self.model[pos]}, ran on {model}")
        c = self.tokens[pos]
        if self.last[pos]:
            request.max_output_tokens = 0          # the recorded request ends here: finish it
            return model, c
        request.trace_pos = pos + 1
        return self.model[pos + 1], c


class FixedThresholds:
    """A constant threshold vector with the :class:`~tr_model.thresholds.ThresholdTable` lookup interface."""

    def __init__(self, thresholds: Sequence[int]):
        self.thresholds = tuple(int(b) for b in thresholds)
        if any(b < 1 for b in self.thresholds):
            raise ValueError(f"thresholds must be integers >= 1, got {list(thresholds)}")

    def lookup(self, active_requests: int) -> tuple:
        return self.thresholds


class Subserver:
    """One model's subserver: a queue, a view of the global active count, and three loops."""

    def __init__(self, rt: "TokenRouterRuntime", index: int):
        self.rt = rt
        self.index = index
        self.waiting: deque[Request] = deque()
        self.channel: asyncio.Queue = asyncio.Queue()  # inter-model loop input: send / peer / ctl messages
        self.client_events: asyncio.Queue = asyncio.Queue()  # client loop input (entry subserver)
        self.wake = asyncio.Event()
        self.active_view = 0
        self.busy = False
        self.started_at = -math.inf  # loop time of the running (or last) batch's launch
        self.batch_len = 0
        self.cap = rt.max_batch_size[index]
        # window statistics
        self.steps = 0
        self.batch_total = 0
        self.wait_total_s = 0.0
        self.waits = 0
        self.busy_s = 0.0
        self.min_batch = math.inf
        self.view_min = math.inf
        self.view_max = -math.inf

    def enqueue(self, req: Request, now: float) -> None:
        req.model = self.index
        req.state = "waiting"
        req.arrived_at = now
        self.waiting.append(req)
        self.wake.set()

    async def client_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            kind, req = await self.client_events.get()
            if kind == "new" and req.cancelled:   # cancelled before its admission: never announced
                req.state = "finished"
                self.rt.cancelled_total += 1
                if req.future is not None and not req.future.done():
                    req.future.set_result(req)
            elif kind == "new":
                self.rt.broadcast_active(+1, self.index)
                self.enqueue(req, loop.time())
            else:  # "done": stream the final response back to the client
                if req.future is not None and not req.future.done():
                    req.future.set_result(req)

    def policy_decision(self, now: float) -> bool:
        """A state-dependent launch policy (a schema-version-3 table): launch now?

        As in the chain, a decision is taken at an event (a completion and its routing, an arrival), in the
        state after this instant's completions and routing and before its launches: while a completion due
        now is not yet processed or a routed request is still in a channel, nothing is decided (their
        processing wakes every subserver); a model that launched at this very instant counts as idle.  Time
        alone never triggers a decision (the chain's epochs are its completions): a model that waits decides
        again at the next event.  The others' residual times come from the executor (``step_end``), else from
        the table's step lengths.  Class ``ratio`` decides the models in turn (fastest first, earlier launches
        counting as running): each subserver evaluates the whole instant's decisions on the state before its
        launches (a batch launched at this instant returned to its queue), so the order the subservers wake
        in does not matter."""
        rt, i = self.rt, self.index
        eps = rt.eps_s
        if not self.instant_settled(now):
            return False
        others = [s for s in rt.subservers if s is not self]
        exact = getattr(rt.executor, "step_end", None) is not None
        residual = [0.0] * rt.M
        running_batch = [0] * rt.M
        waiting = [len(s.waiting) for s in rt.subservers]
        sequential = getattr(rt.thresholds, "policy_class", None) == "ratio"
        for s in others:
            if not s.busy:
                continue
            end = rt.step_end(s)
            if s.started_at < now - eps:   # launched at this very instant: still idle for this decision
                residual[s.index] = 1e300 if end is None else max(0.0, (end - now) * 1000.0 / rt.time_scale)
                running_batch[s.index] = s.batch_len
            elif sequential:   # the instant's state before its launches: the batch is still queued
                waiting[s.index] += s.batch_len
        if sequential:   # the models decide in turn (fastest first): the whole instant's decisions at once
            return bool(self.waiting) and rt.thresholds.decide(self.active_view, waiting, residual,
                                                                running_batch)[i]
        thr = rt.thresholds.launch_threshold(self.active_view, i, waiting, residual)
        return thr is not None and bool(self.waiting) and len(self.waiting) >= thr

    def instant_settled(self, now: float) -> bool:
        """Are this instant's completions and routing all processed?  The chain decides launches only then
        (a launch at an epoch sees every request routed at it), for fixed thresholds as for a policy: with
        deterministic steps many completions coincide, and a launch taken before a coinciding completion has
        routed to this model would start a smaller batch than the chain's (measured 1.5 % low on the virtual
        clock for ME at N = 3 before this rule).  A routed request still in a channel, or another model whose
        step is due now (when the executor reports step ends) and not yet processed, means not yet; their
        processing wakes every subserver."""
        rt = self.rt
        if rt.in_flight:
            return False
        if getattr(rt.executor, "step_end", None) is None:
            return True
        for s in rt.subservers:
            if s is not self and s.busy:
                end = rt.step_end(s)
                if end is not None and end <= now + rt.eps_s:
                    return False
        return True

    async def decoding_loop(self) -> None:
        rt, loop, i = self.rt, asyncio.get_running_loop(), self.index
        while True:
            while True:
                if rt.uses_policy():
                    if self.policy_decision(loop.time()):
                        break
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                b = rt.thresholds.lookup(self.active_view)[i]
                if self.waiting and len(self.waiting) >= b and self.instant_settled(loop.time()):
                    break
                self.wake.clear()
                await self.wake.wait()
            take = len(self.waiting) if self.cap is None else min(self.cap, len(self.waiting))
            batch = [self.waiting.popleft() for _ in range(take)]
            t0 = loop.time()
            in_window = rt.in_window(t0)
            if in_window:
                self.min_batch = min(self.min_batch, len(batch))
                self.view_min = min(self.view_min, self.active_view)
                self.view_max = max(self.view_max, self.active_view)
            for r in batch:
                r.state = "running"
                if in_window:
                    self.wait_total_s += t0 - r.arrived_at
                    self.waits += 1
            self.busy = True
            self.started_at = t0
            self.batch_len = len(batch)
            tokens = await rt.executor.step(i, batch)
            self.busy = False
            t1 = loop.time()
            if in_window:
                self.steps += 1
                self.batch_total += len(batch)
            if rt.in_window(t1):
                self.busy_s += t1 - max(t0, rt.t_start)
            for k, r in enumerate(batch):
                if r.cancelled:   # its client is gone: no routing, its slots are freed now
                    rt.finish(r, t1, i, cancelled=True)
                    continue
                tok = None if tokens is None else tokens[k]
                j, c = rt.router.route(i, r, tok)
                if c > 0:
                    r.committed += c
                    r.committed_by_model[i] = r.committed_by_model.get(i, 0.0) + c
                    if tok is not None:
                        r.token_ids.append(int(tok))
                    rt.record_commit(c, t1)
                if r.committed >= r.max_output_tokens:
                    rt.finish(r, t1, i)
                elif j == i:
                    self.enqueue(r, t1)
                else:
                    r.state = "pending"
                    r.hops += 1
                    rt.in_flight += 1
                    self.channel.put_nowait(("send", j, r))
            rt.notify_all()  # this completion is processed: decisions of this instant may be taken

    async def inter_model_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msg = await self.channel.get()
            if msg[0] == "send":
                self.rt.subservers[msg[1]].channel.put_nowait(("peer", msg[2]))
            elif msg[0] == "peer":
                self.rt.in_flight -= 1
                if msg[1].cancelled:
                    self.rt.finish(msg[1], loop.time(), self.index, cancelled=True)
                else:
                    self.enqueue(msg[1], loop.time())
                if self.rt.in_flight == 0:
                    self.rt.notify_all()
            else:  # ("ctl", delta): admission or finish somewhere in the system
                self.active_view += msg[1]
                self.wake.set()


@dataclass(frozen=True)
class RuntimeResult:
    """What a closed-loop run measured (times in the spec's units, i.e. divided by ``time_scale``)."""

    n_clients: int
    thresholds: str
    time_scale: float
    window_s: float
    tokens: float
    throughput_tok_s: float
    per_request_tok_s: float
    finished_requests: int
    admission_latency_ms: tuple
    mean_batch_size: tuple
    steps: tuple
    utilization: tuple
    relative_timer_noise: float | None
    slice_throughput_tok_s: tuple = ()
    min_batch_size: tuple = ()
    active_view_range: tuple = ()  # per model: (min, max) of its view of the active count at launches

    @property
    def throughput_ci95_tok_s(self) -> float:
        """Half-width of a 95 % batch-means interval of the throughput (nan with < 2 slices)."""
        k = len(self.slice_throughput_tok_s)
        if k < 2:
            return math.nan
        m = sum(self.slice_throughput_tok_s) / k
        var = sum((x - m) ** 2 for x in self.slice_throughput_tok_s) / (k - 1)
        # two-sided 95 % Student t quantiles for k - 1 degrees of freedom (normal beyond 30)
        t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
             15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04}
        q = t.get(k - 1) or (1.96 if k - 1 > 30 else t[max(d for d in t if d <= k - 1)])
        return q * math.sqrt(var / k)


class TokenRouterRuntime:
    """Subservers, their channels and the server interface (:meth:`submit`)."""

    def __init__(self, num_models: int, thresholds: Any, executor: Any, router: Any,
                 max_batch_size: Sequence[int | None] | None = None):
        self.M = num_models
        self.thresholds = thresholds
        self.executor = executor
        self.router = router
        self.max_batch_size = list(max_batch_size) if max_batch_size is not None else [None] * num_models
        self.time_scale = float(getattr(executor, "time_scale", 1.0))
        self.t_start = math.inf
        self.t_end = math.inf
        self.tokens = 0.0
        self.committed_total = 0.0  # every token committed since the start (the server's /health counter)
        self.slices: list[float] = []
        self.request_speeds: list[float] = []
        self.subservers = [Subserver(self, i) for i in range(num_models)]
        self.tasks: list[asyncio.Task] = []
        self.in_flight = 0  # routed requests in a channel, not yet in their next queue
        self.cancelled_total = 0  # requests finished early by cancel() (client gone, deadline, shutdown)
        delta_ms = getattr(thresholds, "delta_ms", None) or 0.1
        self.eps_s = 1e-6 * float(delta_ms) * self.time_scale / 1000.0  # "the same instant" for a policy

    def uses_policy(self) -> bool:
        """Whether the thresholds carry a state-dependent launch policy (a schema-version-3 table)."""
        return getattr(self.thresholds, "policy_class", None) is not None

    def notify_all(self) -> None:
        for s in self.subservers:
            s.wake.set()

    def step_end(self, sub: "Subserver") -> float | None:
        """Loop time at which ``sub``'s running batch ends (the executor's ``step_end``), else an estimate from
        the table's step lengths, else None (unknown)."""
        f = getattr(self.executor, "step_end", None)
        if f is not None:
            end = f(sub.index)
            if end is not None:
                return end
        steps = getattr(self.thresholds, "policy_step_ms", ())
        if steps:
            row = steps[sub.index]
            return sub.started_at + row[max(1, min(sub.batch_len, len(row))) - 1] * self.time_scale / 1000.0
        return None

    def in_window(self, t: float) -> bool:
        return self.t_start <= t <= self.t_end

    def record_commit(self, c: float, t: float) -> None:
        self.committed_total += c
        if self.in_window(t):
            self.tokens += c
            if self.slices:
                k = int((t - self.t_start) / (self.t_end - self.t_start) * len(self.slices))
                self.slices[min(k, len(self.slices) - 1)] += c

    def broadcast_active(self, delta: int, origin: int) -> None:
        """Announce an admission (+1) or a finish (-1): the origin's view changes now, the others' when the
        control message reaches their inter-model loop."""
        for s in self.subservers:
            if s.index == origin:
                s.active_view += delta
                s.wake.set()
            else:
                s.channel.put_nowait(("ctl", delta))

    def cancel(self, req: Request) -> None:
        """Finish ``req`` early (its client is gone): a queued request leaves its queue now, a running or routed
        one at the end of its step or hop; its cache slots are freed and the active count drops as for a finish.
        Idempotent; a finished request is left alone."""
        if req.cancelled or req.state == "finished":
            return
        req.cancelled = True
        if req.state == "waiting":
            sub = self.subservers[req.model]
            try:
                sub.waiting.remove(req)
            except ValueError:
                return   # not admitted yet (still in the client loop's inbox): the client loop drops it
            self.finish(req, asyncio.get_running_loop().time(), req.model, cancelled=True)
            self.notify_all()

    def finish(self, req: Request, t: float, origin: int, cancelled: bool = False) -> None:
        req.state = "finished"
        req.finished_at = t
        if cancelled:
            self.cancelled_total += 1
        elif req.created_at >= self.t_start and t <= self.t_end and t > req.created_at:
            self.request_speeds.append(req.committed / ((t - req.created_at) / self.time_scale))
        release = getattr(self.executor, "release", None)
        if release is not None:
            release(req)  # free the request's cache slots
        self.broadcast_active(-1, origin)
        self.subservers[0].client_events.put_nowait(("done", req))

    async def submit(self, req: Request) -> Request:
        """Server interface: hand a request to the entry subserver and wait for its completion."""
        loop = asyncio.get_running_loop()
        req.future = loop.create_future()
        req.created_at = loop.time()
        req.state = "submitted"
        self.subservers[0].client_events.put_nowait(("new", req))
        return await req.future

    def start(self) -> None:
        for s in self.subservers:
            if s.index == 0:
                self.tasks.append(asyncio.ensure_future(s.client_loop()))
            self.tasks.append(asyncio.ensure_future(s.decoding_loop()))
            self.tasks.append(asyncio.ensure_future(s.inter_model_loop()))


async def run_closed_loop(spec: Any, n_clients: int, thresholds: Any, executor: Any, *, duration_s: float,
                          warmup_s: float = 0.0, max_output_tokens: int = 256, seed: int = 0,
                          router: Any = None, prompt_len: int = 4, vocab_size: int = 1000,
                          slices: int = 10) -> RuntimeResult:
    """Run ``n_clients`` closed-loop clients against a fresh runtime for ``warmup_s + duration_s`` seconds.

    ``thresholds``: a :class:`~tr_model.thresholds.ThresholdTable` (looked up
    with each subserver's live active count) or a fixed vector.  ``duration_s``
    and ``warmup_s`` are wall-clock seconds (already scaled).  The window is
    cut into ``slices`` equal parts for a batch-means confidence interval.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    if not (duration_s > 0) or warmup_s < 0:
        raise ValueError("duration_s must be > 0 and warmup_s >= 0")
    if max_output_tokens < 1:
        raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens!r}")
    if not hasattr(thresholds, "lookup"):
        thresholds = FixedThresholds(thresholds)
    M = spec.M
    if isinstance(thresholds, FixedThresholds):
        B = thresholds.thresholds
        from tr_core.feasibility import check_thresholds
        check_thresholds(B, n_clients, M, name="thresholds")  # SpecError is a ValueError
    router = router or MatrixRouter(spec.routing_matrix, spec.committed_tokens)
    rt = TokenRouterRuntime(M, thresholds, executor, router, spec.max_batch_size)
    rt.slices = [0.0] * max(0, int(slices))
    loop = asyncio.get_running_loop()
    rt.start()
    stop = False
    vocab_size = getattr(executor, "vocab_size", None) or vocab_size
    seeds = random.Random(seed)
    client_seeds = [seeds.getrandbits(64) for _ in range(n_clients)]

    async def client(c: int) -> None:
        seq = 0
        while not stop:
            rng = random.Random(client_seeds[c] * 1_000_003 + seq)
            prompt = [rng.randrange(vocab_size) for _ in range(prompt_len)]
            await rt.submit(Request(rid=c * 10_000_000 + seq, client=c, max_output_tokens=max_output_tokens,
                                    rng=rng, token_ids=prompt, prompt_len=prompt_len))
            seq += 1

    clients = [asyncio.ensure_future(client(c)) for c in range(n_clients)]
    t0 = loop.time()
    rt.t_start = t0 + warmup_s
    rt.t_end = rt.t_start + duration_s
    everything = rt.tasks + clients
    timer = asyncio.ensure_future(asyncio.sleep(rt.t_end - loop.time()))
    try:
        done, _ = await asyncio.wait(everything + [timer], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not timer and t.exception() is not None:
                raise t.exception()
    finally:
        stop = True
        for t in everything + [timer]:
            t.cancel()
        await asyncio.gather(*everything, timer, return_exceptions=True)
    window_model_s = duration_s / rt.time_scale
    subs = rt.subservers
    noise = getattr(executor, "relative_timer_noise", None)
    return RuntimeResult(
        n_clients=n_clients,
        thresholds=str(list(thresholds.thresholds)) if isinstance(thresholds, FixedThresholds) else "table",
        time_scale=rt.time_scale,
        window_s=window_model_s,
        tokens=rt.tokens,
        throughput_tok_s=rt.tokens / window_model_s,
        per_request_tok_s=(sum(rt.request_speeds) / len(rt.request_speeds)) if rt.request_speeds else math.nan,
        finished_requests=len(rt.request_speeds),
        admission_latency_ms=tuple((s.wait_total_s / s.waits) * 1000.0 / rt.time_scale if s.waits else math.nan
                                   for s in subs),
        mean_batch_size=tuple(s.batch_total / s.steps if s.steps else math.nan for s in subs),
        steps=tuple(s.steps for s in subs),
        utilization=tuple(min(1.0, s.busy_s / duration_s) for s in subs),
        relative_timer_noise=noise,
        slice_throughput_tok_s=tuple(x / (window_model_s / len(rt.slices)) for x in rt.slices),
        min_batch_size=tuple(s.min_batch for s in subs),
        active_view_range=tuple((s.view_min, s.view_max) for s in subs),
    )


class _VirtualClockSelector(selectors.SelectSelector):
    """A selector whose waits advance a virtual clock instead of blocking.

    ``select(timeout)`` first polls the real descriptors (the loop's self-pipe:
    threads may still wake it); when nothing is ready it returns at once and
    moves the clock forward by ``timeout``, which asyncio computed as the delay
    to its earliest timer.  ``timeout is None`` (no timer at all) means only a
    real event can make progress, so that one wait is real.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None):
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            return super().select(None)
        if timeout > 0:
            self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: every ``sleep`` and timer completes in zero wall time, exactly on time.

    The runtime is then a discrete-event simulation of itself: the same three
    loops, queues and control messages, but a step of ``L`` ms lasts exactly
    ``L`` ms of loop time, so a run is a pure function of its seed and its
    results are exact (no timer overshoot, no machine load).  Work done in
    threads (``asyncio.to_thread``) takes no virtual time; executors that must
    account for compute time sleep for it explicitly.
    """

    def __init__(self) -> None:
        self._vsel = _VirtualClockSelector()
        super().__init__(self._vsel)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vsel.now


def new_event_loop(clock: str = "wall") -> asyncio.AbstractEventLoop:
    """An event loop for the runtime: ``clock="wall"`` (real time) or ``"virtual"`` (:class:`VirtualTimeLoop`).

    The wall-clock loop uses ``select()``: asyncio's default selector on Linux
    (epoll) rounds every timeout up to a whole millisecond, which makes each
    emulated step overshoot by ~0.5-2 ms; ``select()`` takes microseconds, and
    the runtime only waits on a handful of descriptors, so it costs nothing.
    """
    if clock == "virtual":
        return VirtualTimeLoop()
    if clock != "wall":
        raise ValueError(f"clock must be 'wall' or 'virtual', got {clock!r}")
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def run_in_new_loop(coro: Any, clock: str = "wall") -> Any:
    """Run a coroutine to completion in a fresh :func:`new_event_loop` with that clock."""
    loop = new_event_loop(clock)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    except BaseException:
        # Ctrl-C / SIGTERM (raised in the loop): cancel what runs and let it unwind here, so that no task is
        # destroyed pending and no callback reaches a closed loop ("Event loop is closed")
        _cancel_all(loop)
        raise
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task of ``loop`` (not running) and run it until they have ended; a second interrupt while
    they unwind is ignored (the tasks are ended either way)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    for _ in range(2):
        try:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            return
        except BaseException:  # noqa: BLE001 - an interrupt while unwinding: try once more, then give up
            continue


def measure_closed_loop(spec: Any, n_clients: int, thresholds: Any, executor: Any, *, clock: str = "wall",
                        **kw) -> RuntimeResult:
    """Synchronous wrapper of :func:`run_closed_loop` in its own :func:`new_event_loop` (``clock`` "wall" or
    "virtual"; with "virtual", ``duration_s`` and ``warmup_s`` are virtual seconds and the run takes only the
    CPU time of its events)."""
    if clock not in ("wall", "virtual"):
        raise ValueError(f"clock must be 'wall' or 'virtual', got {clock!r}")
    return run_in_new_loop(run_closed_loop(spec, n_clients, thresholds, executor, **kw), clock=clock)
