"""The compact launch-policy classes: one record each, the one place a class is named and described.

A class is its name, its parameters per model (which of them are time windows), the columns a deployed
table carries, whether its header carries step lengths, and the code of its branch in the compiled rule
(``optimizer._kernels._class_mask``).  Adding a class: a record here and its branch there (and, for the
deployed tables, the stdlib reader ``tr_model/thresholds.py``, which keeps its own copy of the columns and
the rule: ``tests/test_policy_classes.py`` holds the two to each other).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyClass:
    """One compact policy class."""

    name: str
    code: int                       # its branch of the compiled rule (optimizer._kernels.CLS_*)
    columns: tuple[str, ...]        # per-model parameters as a deployed table names them
    windows: tuple[bool, ...]       # which parameters are time windows (quanta here, ms in a table)
    step_lengths: bool              # a deployed table's header carries the step lengths
    summary: str

    @property
    def n_params(self) -> int:
        return len(self.columns)

    @property
    def window_column(self) -> bool:
        """Whether a deployed table's later columns hold a window in ms (a number >= 0), not a threshold."""
        return any(self.windows)


REGISTRY: dict[str, PolicyClass] = {c.name: c for c in (
    PolicyClass("busy", 0, ("others_idle", "others_busy"), (False, False), False,
                "a threshold while no other model runs, another while one does"),
    PolicyClass("residual", 1, ("others_idle", "others_end_later", "others_end_sooner"), (False, False, False), True,
                "as busy, with a third threshold while another model's batch ends before this one's step would"),
    PolicyClass("window", 2, ("threshold", "window_ms"), (False, True), False,
                "a threshold, but wait while another model's batch ends within the window"),
    PolicyClass("ratio", 3, ("threshold", "window_ms"), (False, True), True,
                "wait while the requests about to return outweigh the own queue (window per request); fastest "
                "model decides first"),
)}

CLASSES = tuple(REGISTRY)
CLASS_PARAMS = {c.name: c.n_params for c in REGISTRY.values()}
CLASS_CODE = {c.name: c.code for c in REGISTRY.values()}
WINDOW_PARAM = {c.name: c.windows for c in REGISTRY.values()}
POLICY_COLUMNS = {c.name: c.columns for c in REGISTRY.values()}
WINDOW_CLASSES = tuple(c.name for c in REGISTRY.values() if c.window_column)
STEP_CLASSES = tuple(c.name for c in REGISTRY.values() if c.step_lengths)


def policy_class(name: str) -> PolicyClass:
    """The record of class ``name``; ValueError naming the known classes otherwise."""
    hit = REGISTRY.get(name)
    if hit is None:
        raise ValueError(f"unknown policy class {name!r}; choose one of {', '.join(CLASSES)}")
    return hit
