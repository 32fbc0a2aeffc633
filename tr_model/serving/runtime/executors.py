"""Step executors: what one decoding step of a batch on one model costs.

The runtime calls ``await executor.step(model, batch)`` from a subserver's
decoding loop; the coroutine returns when the step is over, with the next token
id of every request in the batch (or ``None`` when no real tokens exist).

* :class:`EmulatedExecutor` sleeps ``L_i(b) * time_scale`` milliseconds, where
  ``L_i(b)`` is the spec's step latency (constant or a batch-size curve),
  plus, with ``extend_ms_per_token(model, b)``, the catch-up cost of the
  tokens the model has not seen (the law of ``simulator.simulate``'s
  ``extend_ms_per_token``, so that the two can be checked against each
  other).  Co-running, one of two distinct laws (docs/engine.md, "The two co-running laws"):

  - ``corun_latency_ms``: the chain's *launch law*: a batch launched while another model runs (after this
    instant's completions) or launches at the same instant lasts ``corun_latency_ms(model, b)`` instead of
    ``L_i(b)``, fixed at its launch.  The tie rule is not restated here: the executor counts the models
    running and launching at the instant and asks ``dtmc._kernels.corun_at_launch``, the one rule every
    kernel calls (its Python body, imported when the executor is made: no numba compilation in the event
    loop, and no numba import for an executor without this law);
  - ``corun_slowdown`` (an ``M x M`` matrix): the *rate-sharing law* of ``simulator.simulate``
    (``corun_law="rate-sharing"``), which is not a launch law: a running step is stretched while other
    models run, model i progressing at rate ``1 / prod_k f_ik`` over the running models k
    (:func:`rate_sharing_slowdown`, the one place the executor states it).
  ``step_end(model)`` gives the loop time at which the model's running step ends (a state-dependent
  launch policy reads the others' residual times from it).  It sleeps until an absolute deadline so that event-loop lag does not accumulate
  inside a step, and records how far each wake-up overshot the deadline: with
  asyncio on Linux the overshoot is typically 0-1 ms (epoll's millisecond
  timeout granularity), so ``time_scale`` must make the shortest step long
  enough for the overshoot to be a small fraction (``time_scale = 20`` gives a
  120 ms step for L = 6 ms, i.e. about 0.5 %).
* :class:`tr_model.serving.runtime.torch_executor.TorchExecutor` (loaded lazily by
  :func:`torch_executor`: the only runtime module that imports torch) runs
  Qwen3 models with per-model slot KV caches, catch-up extends and, on CUDA,
  graph-replayed steps.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

__all__ = ["StepExecutor", "EmulatedExecutor", "rate_sharing_slowdown", "torch_executor"]


def rate_sharing_slowdown(corun: Sequence[Sequence[float]], model: int, running) -> float:
    """The *rate-sharing law* (not the launch law): while the models in ``running`` run, ``model`` progresses
    at rate ``1 / f``, ``f = prod corun[model][k]`` over the running ``k != model`` (the law of
    ``simulator.simulate(corun_law="rate-sharing")``; the set changes only when a step starts or ends)."""
    f = 1.0
    for k in running:
        if k != model:
            f *= corun[model][k]
    return f


def _launch_law_rule():
    """The launch law's tie rule, ``corun_at_launch(corun, running, launching)`` of ``dtmc._kernels`` (the one
    copy the chain, the decision processes, the mean field and the simulator compile): its Python body, so
    that deciding a step's duration never compiles inside the event loop."""
    from dtmc._kernels import corun_at_launch
    return getattr(corun_at_launch, "py_func", corun_at_launch)   # a plain function under NUMBA_DISABLE_JIT


class StepExecutor:
    """Interface of a step executor (subclass it or duck-type ``step``)."""

    async def step(self, model: int, batch: Sequence[Any]) -> list[int] | None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (threads, devices); the default has none."""


class EmulatedExecutor(StepExecutor):
    """Sleeps for the spec's step latency, stretched by ``time_scale``.

    ``latency_ms``: a callable ``(model, batch_size) -> ms`` (for instance
    ``spec.latency_ms``).  ``time_scale`` >= 1 multiplies every sleep; the
    runtime divides measured times by the same factor, so results are in the
    spec's time units.
    """

    def __init__(self, latency_ms: Callable[[int, int], float], time_scale: float = 1.0,
                 extend_ms_per_token: Callable[[int, int], float] | None = None,
                 corun_slowdown: Sequence[Sequence[float]] | None = None,
                 corun_latency_ms: Callable[[int, int], float] | None = None):
        if not (time_scale > 0):
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        if corun_slowdown is not None and corun_latency_ms is not None:
            raise ValueError("corun_slowdown (rate-sharing law) and corun_latency_ms (launch law) are two laws "
                             "of co-running; give one")
        self.corun_latency_ms = corun_latency_ms
        self._corun_at_launch = _launch_law_rule() if corun_latency_ms is not None else None
        self._law: dict[int, dict] = {}      # launch law: model -> its running step
        self._ends: dict[int, float] = {}    # solo steps: model -> deadline
        self.latency_ms = latency_ms
        self.extend_ms_per_token = extend_ms_per_token
        self.corun = [list(map(float, row)) for row in corun_slowdown] if corun_slowdown is not None else None
        self._running: dict[int, dict] = {}
        self.time_scale = float(time_scale)
        self.overshoot_s_total = 0.0
        self.nominal_s_total = 0.0
        self.steps = 0
        self.overshoot_s_by_model: dict[int, float] = {}  # per model: wake-up lateness summed over its steps
        self.steps_by_model: dict[int, int] = {}

    async def step(self, model: int, batch: Sequence[Any]) -> None:
        loop = asyncio.get_running_loop()
        ms = self.latency_ms(model, len(batch))
        base_s = ms * self.time_scale / 1000.0
        if self.extend_ms_per_token is not None:
            # the catch-up a real executor pays: each row feeds the tokens this model has not seen (prompt +
            # committed tokens since the request's last step here); the batch is as long as its longest row
            T = 1.0
            for r in batch:
                have = r.prompt_len + r.committed
                T = max(T, have - r.executor_state.get(("seen", model), 0.0))
                r.executor_state[("seen", model)] = have
            ms += self.extend_ms_per_token(model, len(batch)) * (T - 1.0)
        nominal = ms * self.time_scale / 1000.0
        if self.corun_latency_ms is not None:
            co = self.corun_latency_ms(model, len(batch)) * self.time_scale / 1000.0 + (nominal - base_s)
            late = await self._launch_law_step(loop, model, nominal, co)
        elif self.corun is not None:
            late = await self._rate_sharing_step(loop, model, nominal)
        else:
            deadline = loop.time() + nominal
            self._ends[model] = deadline
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.sleep(left)
            late = loop.time() - deadline
        self._account(model, nominal, late)
        return None

    def _account(self, model: int, nominal_s: float, late_s: float) -> None:
        """One finished step: its nominal length and how late its end was processed (every law: the wake-up
        after the step's deadline, whether a sleep or a timer callback ends it)."""
        self.overshoot_s_total += late_s
        self.nominal_s_total += nominal_s
        self.steps += 1
        self.overshoot_s_by_model[model] = self.overshoot_s_by_model.get(model, 0.0) + late_s
        self.steps_by_model[model] = self.steps_by_model.get(model, 0) + 1

    def step_end(self, model: int) -> float | None:
        """Loop time at which ``model``'s running step ends (None when it runs none)."""
        if self.corun_latency_ms is not None:
            e = self._law.get(model)
            return None if e is None else e["end"]
        if self.corun is not None:
            e = self._running.get(model)
            return None if e is None or e["handle"] is None else e["handle"].when()
        return self._ends.get(model)

    # ---- co-running, launch law: the duration is fixed at launch by whether another model runs ------------
    async def _launch_law_step(self, loop: Any, model: int, solo_s: float, co_s: float) -> float:
        """One step under the launch law.  The models of this instant's launch pass are those whose step
        started at this instant (this one included); the running ones are the others whose step ends after it
        (a step ending now is over).  ``corun_at_launch(True, running, launching)`` gives the pass's answer;
        the launches of one instant arrive one at a time, so every earlier launch of the pass is given the
        answer as the pass now stands (a solo launch joined at the same instant runs co-located)."""
        now = loop.time()
        eps = 1e-9 + 1e-12 * abs(now)
        pass_ = {k: e for k, e in self._law.items() if k != model and abs(e["start"] - now) <= eps}
        running = sum(1 for k, e in self._law.items() if k != model and k not in pass_ and e["end"] > now + eps)
        co = bool(self._corun_at_launch(True, running, len(pass_) + 1))
        fut = loop.create_future()
        entry = {"start": now, "end": now + (co_s if co else solo_s), "solo_s": solo_s, "co_s": co_s, "co": co,
                 "fut": fut}
        for k, e in pass_.items():
            if e["co"] != co:
                e["co"], e["end"] = co, e["start"] + (e["co_s"] if co else e["solo_s"])
                e["handle"].cancel()
                e["handle"] = loop.call_at(e["end"], self._law_done, k, e)
        entry["handle"] = loop.call_at(entry["end"], self._law_done, model, entry)
        self._law[model] = entry
        try:
            await fut
        finally:
            if self._law.get(model) is entry:  # cancelled (the run ended)
                entry["handle"].cancel()
                del self._law[model]
        return max(0.0, loop.time() - entry["end"])   # entry["end"]: the final deadline (co-running may move it)

    def _law_done(self, model: int, entry: dict) -> None:
        if self._law.get(model) is entry:
            del self._law[model]
        if not entry["fut"].done():
            entry["fut"].set_result(None)

    # ---- co-running, rate-sharing law: running models progress at rate 1 / rate_sharing_slowdown -------------
    def _advance(self, now: float) -> None:
        for e in self._running.values():
            e["rem"] -= (now - e["t"]) / e["f"]
            e["t"] = now

    def _reschedule(self, loop: Any) -> None:
        now = loop.time()
        for i, e in self._running.items():
            e["f"] = f = rate_sharing_slowdown(self.corun, i, self._running)
            if e["handle"] is not None:
                e["handle"].cancel()
            e["handle"] = loop.call_at(now + max(0.0, e["rem"]) * f, self._complete, loop, i)

    def _complete(self, loop: Any, model: int) -> None:
        self._advance(loop.time())
        e = self._running.pop(model)
        e["due"] = e["handle"].when()   # the step's last deadline (the wake-up lateness is measured from it)
        if not e["fut"].done():
            e["fut"].set_result(None)
        self._reschedule(loop)

    async def _rate_sharing_step(self, loop: Any, model: int, nominal_s: float) -> float:
        """A step of ``nominal_s`` seconds of solo work under the rate-sharing law; the set of running models
        (it changes only when a step starts or ends) sets every running step's rate
        (:func:`rate_sharing_slowdown`), as in ``simulator.simulate``'s ``corun_slowdown``."""
        self._advance(loop.time())
        fut = loop.create_future()
        entry = {"rem": nominal_s, "t": loop.time(), "f": 1.0, "fut": fut, "handle": None}
        self._running[model] = entry
        self._reschedule(loop)
        try:
            await fut
        finally:
            if self._running.get(model) is entry:  # cancelled (the run ended): leave the device
                self._advance(loop.time())
                entry["handle"].cancel()
                del self._running[model]
                self._reschedule(loop)
        return max(0.0, loop.time() - entry["due"])

    @property
    def relative_timer_noise(self) -> float:
        """Mean overshoot of a step's end over its nominal length, as a fraction of the mean step."""
        return self.overshoot_s_total / self.nominal_s_total if self.nominal_s_total else 0.0


def torch_executor(*args, **kwargs):
    """Build :class:`tr_model.serving.runtime.torch_executor.TorchExecutor` (imports torch only when called)."""
    from tr_model.serving.runtime.torch_executor import TorchExecutor
    return TorchExecutor(*args, **kwargs)
