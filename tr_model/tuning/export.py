"""Thresholds for real servers: a thresholds file as the launch arguments of R2R (``tr-autotune export r2r``).

R2R (``thu-nics/R2R``, the SGLang-based server the TokenRouter paper measured) takes the delayed-batching
thresholds on its launcher ``script/inference/launch_r2r_server.py``::

    --slm-min-batch-size a1,a2,...,aK     # small ("quick") model: entry N-1 is used with N active requests
    --llm-min-batch-size c1,c2,...,cK     # large ("reference") model: the same indexing

What its code does with them (read from the public repository, not copied):

* the launcher turns a value made only of digits into an ``int`` and anything else into
  ``[int(x) for x in value.split(",")]``;
* the small model's scheduler clamps the active count to the list's length (N above the list uses its last
  entry);
* the large model's scheduler does **not** clamp: with more active requests than entries it raises
  ``IndexError``, and a plain ``int`` is ignored there (it launches at 1) -- only the list form works.

So the export always writes one entry per N = 1..N_max, where N_max is the largest number of requests the
server will ever hold (the clients' concurrency), and refuses a table that has no row for some N <= N_max.
Model 0 of the table is R2R's small model, model 1 its large model.  With N_max = 1 the single entry reads
as an ``int`` on R2R's side; that is harmless because ``B*(1) = (1, 1)`` always (the feasibility rule
``sum(B_i - 1) < N``), which is what both schedulers do with an ``int`` or with no flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from tr_core.errors import SpecError

__all__ = ["R2RLaunchArgs", "r2r_launch_args", "r2r_parse_rule", "r2r_spec_notes"]

EXACT = ("exhaustive", "pruned-exact")


def r2r_parse_rule(value: str):
    """R2R's launcher rule for one of the two flags (restated): digits only -> int, else a comma list of ints."""
    return int(value) if value.isdigit() else [int(x) for x in value.split(",")]


def _spans(ns: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` -> ``"1-3, 7, 9-10"``."""
    out, k = [], 0
    while k < len(ns):
        j = k
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[k]) if j == k else f"{ns[k]}-{ns[j]}")
        k = j + 1
    return ", ".join(out)


@dataclass(frozen=True)
class R2RLaunchArgs:
    """The two R2R flags for N = 1..max_concurrency, and where every row came from."""

    max_concurrency: int
    slm_min_batch_size: tuple  # B_0(N) for N = 1..max_concurrency
    llm_min_batch_size: tuple  # B_1(N)
    certificates: tuple  # per N: the row's certificate, or None (a schema-1 file)
    gaps: tuple  # per N: the row's relative gap to a proven bound (0 exact, None unknown)
    extrapolated_from: tuple  # per N: the computed N an extrapolated row copies (None otherwise)
    thresholds_file: str | None = None
    model_names: tuple | None = None

    @property
    def slm_arg(self) -> str:
        return ",".join(map(str, self.slm_min_batch_size))

    @property
    def llm_arg(self) -> str:
        return ",".join(map(str, self.llm_min_batch_size))

    def argv(self) -> list[str]:
        return ["--slm-min-batch-size", self.slm_arg, "--llm-min-batch-size", self.llm_arg]

    def rows_with(self, *certificates: str) -> list[int]:
        return [n for n, c in enumerate(self.certificates, start=1) if c in certificates]

    def provenance_lines(self) -> list[str]:
        """What a user must know about the rows: extrapolated, certified, local, or unknown certificates."""
        lines = []
        if not any(self.certificates):
            lines.append(f"the thresholds file has no per-row certificates (schema_version 1): rows N = "
                         f"1-{self.max_concurrency} are not known to be exact")
            return lines
        ext = self.rows_with("extrapolated")
        if ext:
            srcs = sorted({self.extrapolated_from[n - 1] for n in ext}, key=lambda s: (s is None, s or 0))
            what = ", ".join("all ones" if s is None else f"the row of N = {s}" for s in srcs)
            lines.append(f"rows N = {_spans(ext)} are extrapolated (not computed: copied from {what}); finish the "
                         f"table with tr-autotune run for exact rows")
        cert = self.rows_with("certified")
        if cert:
            worst = max((self.gaps[n - 1] or 0.0) for n in cert)
            lines.append(f"rows N = {_spans(cert)} are certified, not exact: each within {100 * worst:.3g}% of the "
                         f"best throughput (largest gap)")
        local = self.rows_with("local")
        if local:
            lines.append(f"rows N = {_spans(local)} come from a local search (no optimality guarantee)")
        return lines

    def to_dict(self) -> dict:
        rows = [{"N": n, "slm_min_batch_size": a, "llm_min_batch_size": b, "certificate": c, "gap": g,
                 "extrapolated_from": e}
                for n, (a, b, c, g, e) in enumerate(zip(self.slm_min_batch_size, self.llm_min_batch_size,
                                                        self.certificates, self.gaps, self.extrapolated_from),
                                                    start=1)]
        return {"schema_version": 1, "kind": "r2r-launch-args", "thresholds_file": self.thresholds_file,
                "model_names": None if self.model_names is None else list(self.model_names),
                "max_concurrency": self.max_concurrency,
                "slm_min_batch_size": list(self.slm_min_batch_size),
                "llm_min_batch_size": list(self.llm_min_batch_size),
                "args": self.argv(),
                "extrapolated": self.rows_with("extrapolated"), "certified": self.rows_with("certified"),
                "local": self.rows_with("local"), "exact": self.rows_with(*EXACT), "rows": rows}


def r2r_launch_args(table, max_concurrency: int | None = None) -> R2RLaunchArgs:
    """R2R's two launch lists for N = 1..max_concurrency from a :class:`tr_model.thresholds.ThresholdTable`.

    ``max_concurrency`` (default: the table's ``max_concurrency``) is the most requests the server will hold
    at once.  Raises :class:`SpecError` when the table is not for two models or has no row for some
    N <= max_concurrency (R2R's large-model scheduler would fail at that N).
    """
    if table.num_models != 2:
        raise SpecError(f"R2R runs two models (small, large); the thresholds file has {table.num_models}")
    if table.source == "fallback":
        raise SpecError("the eager fallback table is not a thresholds file; R2R's default (no flags) is eager")
    rows = len(table.thresholds)
    if max_concurrency is None:
        max_concurrency = table.max_concurrency
        if rows < max_concurrency:
            raise SpecError(f"the thresholds file has rows for N = 1..{rows} only, not its max_concurrency "
                            f"{max_concurrency}; R2R's large model fails past the last entry: give "
                            f"--N <= {rows} (and run no more clients), or extend the table with "
                            f"tr-autotune run --N {max_concurrency}")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise SpecError(f"--N must be an integer >= 1, got {max_concurrency!r}")
    if max_concurrency > rows:
        raise SpecError(f"the thresholds file covers N = 1..{rows}, but the server's maximum concurrency is "
                        f"{max_concurrency}: R2R's large model would fail with more than {rows} active "
                        f"requests; recompute the table with tr-autotune run --N {max_concurrency}, or export a smaller --N")
    ths = table.thresholds[:max_concurrency]
    certs = tuple(table.certificates[:max_concurrency]) if table.certificates else (None,) * max_concurrency
    gaps = tuple(table.gaps[:max_concurrency]) if table.gaps else (None,) * max_concurrency
    K = table.covered_concurrency
    # the reader keeps no extrapolated_from; name the largest computed row with the same vector
    last_with = {v: j for j, v in enumerate(table.thresholds[:K], start=1)} if "extrapolated" in certs else {}
    src = [last_with.get(ths[n - 1]) if c == "extrapolated" else None for n, c in enumerate(certs, start=1)]
    return R2RLaunchArgs(max_concurrency=max_concurrency, slm_min_batch_size=tuple(int(b[0]) for b in ths),
                         llm_min_batch_size=tuple(int(b[1]) for b in ths), certificates=certs, gaps=gaps,
                         extrapolated_from=tuple(src), thresholds_file=table.path, model_names=table.model_names)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def r2r_spec_notes(spec_doc) -> list[str]:
    """Warnings when the spec a table was computed for does not look like an R2R system.

    R2R's model 0 must be the small (faster) model, and after its one step the large model always hands
    back (``p_10 = 1``); a table computed for another system still exports, but is probably the wrong table.
    """
    notes: list[str] = []
    if not isinstance(spec_doc, dict):
        return notes
    L = spec_doc.get("step_latency_ms")
    if isinstance(L, list) and len(L) == 2:
        a, b = _num(L[0]), _num(L[1])
        if a is not None and b is not None and a > b:
            notes.append(f"the spec's model 0 steps in {a:g} ms, model 1 in {b:g} ms: R2R's small ('quick') model "
                         f"is model 0 of the table; check the model order")
    P = spec_doc.get("routing_matrix")
    if isinstance(P, list) and len(P) == 2 and isinstance(P[1], list) and len(P[1]) == 2:
        p10 = _num(P[1][0])
        if p10 is not None and abs(p10 - 1.0) > 1e-9:
            notes.append(f"the spec's p_10 is {p10:g}, but R2R hands every request back to the small model "
                         f"after one large-model step (p_10 = 1): the table was computed for another routing")
    return notes
