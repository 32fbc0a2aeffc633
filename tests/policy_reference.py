"""An independent statement of the compact policy classes' launch rules, in NumPy over all configurations at
once: the oracle the compiled rule (``optimizer._kernels._class_mask``, which ``optimizer.policy.class_table``
applies) is tested against.  It is vectorised over configurations where the kernel loops over models, so the
two are written differently from the same rule (``optimizer.policy.class_table``'s docstring), and a slip in
either shows as a disagreement."""

from __future__ import annotations

import numpy as np

from optimizer import policy as POL


def class_launch_reference(proc, cls: str, params) -> np.ndarray:
    """(n, M) launch booleans of class ``cls`` with ``params`` in every configuration of ``proc``."""
    S = proc.configs
    M = proc.M
    Bp = np.asarray(params, dtype=np.int64).reshape(M, POL.CLASS_PARAMS[cls])
    if cls == "ratio":
        return _ratio_launch(proc, S, Bp)
    running = S[:, :, 2] > 0
    launch = np.zeros((S.shape[0], M), dtype=bool)
    big = np.int64(1) << 40
    dco = proc.d if proc.dco is None else proc.dco
    for j in range(M):
        oth = [i for i in range(M) if i != j]
        other = running[:, oth].any(axis=1)
        thr = np.where(other, Bp[j, 1], Bp[j, 0])
        if cls == "residual":
            rmin = np.where(running[:, oth], S[:, oth, 2], big).min(axis=1)
            take = np.minimum(S[:, j, 0], int(proc.caps[j]))
            own = dco[j, take]
            thr = np.where(other & (rmin < own), Bp[j, 2], thr)
        if cls == "window":
            rmin = np.where(running[:, oth], S[:, oth, 2], big).min(axis=1)
            thr = np.where(rmin <= Bp[j, 1], big, Bp[j, 0])
        launch[:, j] = (~running[:, j]) & (S[:, j, 0] >= np.maximum(thr, 1))
    return launch


def _ratio_launch(proc, S: np.ndarray, Bp: np.ndarray) -> np.ndarray:
    """The ``ratio`` class's decisions: the models decide one after another, fastest step first, each seeing
    the batches launched before it in the same epoch (their residual: the step under the launch law)."""
    M, n = proc.M, S.shape[0]
    dco = proc.d if proc.dco is None else proc.dco
    R = S[:, :, 2].copy()
    Bb = S[:, :, 1].copy()
    launch = np.zeros((n, M), dtype=bool)
    for j in sorted(range(M), key=lambda m: (int(proc.d[m, 1]), m)):
        oth = [i for i in range(M) if i != j]
        run = R > 0
        wait = np.zeros(n, dtype=bool)
        for i in oth:
            t = R[:, i]
            arriving = np.zeros(n, dtype=np.int64)
            for l in oth:
                arriving += np.where(run[:, l] & (R[:, l] <= t), Bb[:, l], 0)
            wait |= run[:, i] & (t * S[:, j, 0] <= Bp[j, 1] * arriving)
        go = (S[:, j, 2] == 0) & (S[:, j, 0] >= max(int(Bp[j, 0]), 1)) & ~wait
        launch[:, j] = go
        take = np.minimum(S[:, j, 0], int(proc.caps[j]))
        step = np.where(run[:, oth].any(axis=1), dco[j, take], proc.d[j, take])
        R[:, j] = np.where(go, step, R[:, j])
        Bb[:, j] = np.where(go, take, Bb[:, j])
    return launch
