"""The approaches of ShadowPrefill's Table 2 as simulator policies.

=================  =============================================================================
No Shadow          cold switch; the baseline
Host Tier          No Shadow with the host-DRAM KV tier (evicted session entries spill to host
                   memory and are reloaded over PCIe when a call hits them)
Harvest            shadow jobs under a fixed credit (delta = 0.1 of decode-only iteration time,
                   spent on every busy iteration); idle instances run capped shadow iterations
Harvest-SLO        shadow jobs under the SLO-slack controller (Algorithm 1, delta = 0.025 spent
                   only on iterations that carry a routed call, and only by jobs whose predicted
                   switch probability is >= ClusterConfig.credit_gate, 0.25)
Harvest-SLO+Host   Harvest-SLO with the host tier (the complete design)
Predictive         Harvest, gated: a session is shadowed to a model only while the predicted
                   probability that its next call goes there is >= 0.25
Dedicated          one extra instance per model (no normal traffic, no routed calls) runs all
                   shadow work into warm copies; a switch call pulls its copy over the network (+GPUs)
Eager              shadow work as normal-priority requests queued with normal traffic
Oracle             a switch call's history is cached for free
Oracle+Host        Oracle with the host tier
=================  =============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shadow_prefill.errors import ShadowError

__all__ = ["Policy", "APPROACHES", "APPROACH_NAMES", "HARVESTING", "get_policy", "SHADOW_MODES"]

SHADOW_MODES = {"none": 0, "harvest": 1, "harvest-slo": 2, "dedicated": 3, "eager": 4}


@dataclass(frozen=True)
class Policy:
    """One approach: how shadow work runs and which cache features are on."""

    name: str
    shadow: str = "none"
    host: bool = False
    oracle: bool = False
    delta: float = 0.025
    gate: float = 0.0
    top1: bool = False

    def __post_init__(self):
        if self.shadow not in SHADOW_MODES:
            raise ShadowError(f"policy {self.name!r}: shadow must be one of {', '.join(SHADOW_MODES)}, "
                              f"got {self.shadow!r}")
        if not (self.delta >= 0):
            raise ShadowError(f"policy {self.name!r}: delta must be >= 0, got {self.delta!r}")
        if not (0.0 <= self.gate <= 1.0):
            raise ShadowError(f"policy {self.name!r}: gate must be in [0, 1], got {self.gate!r}")
        if self.oracle and self.shadow != "none":
            raise ShadowError(f"policy {self.name!r}: an oracle does no shadow work")

    @property
    def dedicated(self) -> bool:
        return self.shadow == "dedicated"

    def with_top1(self, top1: bool = True) -> "Policy":
        return replace(self, top1=top1, name=self.name + (", top-1" if top1 else ""))


APPROACHES: dict[str, Policy] = {p.name: p for p in (
    Policy("No Shadow"),
    Policy("Host Tier", host=True),
    Policy("Harvest", shadow="harvest", delta=0.1),
    Policy("Harvest-SLO", shadow="harvest-slo", delta=0.025),
    Policy("Harvest-SLO+Host", shadow="harvest-slo", delta=0.025, host=True),
    Policy("Predictive", shadow="harvest", delta=0.1, gate=0.25),
    Policy("Dedicated", shadow="dedicated", delta=0.025),
    Policy("Eager", shadow="eager"),
    Policy("Oracle", oracle=True),
    Policy("Oracle+Host", oracle=True, host=True),
)}
APPROACH_NAMES = tuple(APPROACHES)
HARVESTING = ("Harvest", "Harvest-SLO", "Harvest-SLO+Host", "Predictive")

_ALIASES = {n.lower().replace(" ", "-").replace("+", "-"): n for n in APPROACHES}
_ALIASES.update({n.lower(): n for n in APPROACHES})


def get_policy(name: str | Policy) -> Policy:
    """A Table 2 approach by name (case-insensitive; ``harvest-slo-host`` = ``Harvest-SLO+Host``)."""
    if isinstance(name, Policy):
        return name
    key = str(name).strip().lower()
    key2 = key.replace(" ", "-").replace("+", "-")
    if key in _ALIASES:
        return APPROACHES[_ALIASES[key]]
    if key2 in _ALIASES:
        return APPROACHES[_ALIASES[key2]]
    raise ShadowError(f"unknown approach {name!r}; known: {', '.join(APPROACHES)}")
