"""The policy-class registry is the one source of the classes' names and metadata, and the stdlib reader's
own copies (tr_model/thresholds.py imports nothing) agree with it."""

from optimizer import _kernels as K
from optimizer import policy as POL
from optimizer import policy_classes as PC
from tr_model import thresholds as TH


def test_registry_matches_the_kernel_codes():
    assert PC.CLASS_CODE == {"busy": K.CLS_BUSY, "residual": K.CLS_RESIDUAL, "window": K.CLS_WINDOW,
                             "ratio": K.CLS_RATIO}
    assert len(set(PC.CLASS_CODE.values())) == len(PC.CLASSES)


def test_the_optimizer_reads_the_registry():
    assert POL.CLASSES == PC.CLASSES and POL.CLASS_PARAMS == PC.CLASS_PARAMS
    for c in PC.REGISTRY.values():
        assert len(c.windows) == c.n_params


def test_the_stdlib_reader_keeps_the_same_columns():
    assert dict(TH.POLICY_COLUMNS) == PC.POLICY_COLUMNS
    assert tuple(TH.WINDOW_CLASSES) == PC.WINDOW_CLASSES
    assert tuple(TH.STEP_CLASSES) == PC.STEP_CLASSES
