import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# The suite keeps its caches to itself: every result cache (tr-optimize's evaluations, autotune tables)
# and anything else written under $XDG_CACHE_HOME goes to one temporary folder per test session, removed
# at the end; set before any test module is imported so subprocesses inherit it too.
_SESSION_DIR = tempfile.mkdtemp(prefix="tr-model-tests-")
os.environ["TR_MODEL_CACHE_DIR"] = os.path.join(_SESSION_DIR, "evaluations")
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_DIR, "xdg-cache")


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def shared_path(*parts: str) -> str:
    """A path under ../shared (the reference data, read in place); skips the test, saying so, when absent."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(f"needs the shared reference data, not present here: {path}")
    return path


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A result cache folder inside this test's tmp_path (also for subprocesses)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TR_MODEL_CACHE_DIR", str(d))
    return d


def tool(name: str) -> list[str]:
    """Command line of a console script installed beside this interpreter (falls back to PATH)."""
    cand = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(cand):
        return [cand]
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"console script {name} is not installed")
    return [found]


@pytest.fixture
def run_tool():
    import subprocess

    def run(name, *args, input=None, cwd=None, timeout=300):
        return subprocess.run(tool(name) + [str(a) for a in args], capture_output=True, text=True,
                              input=input, cwd=cwd, timeout=timeout)
    return run


def pytest_collection_modifyitems(config, items):
    # Longest first: the tests marked slow start the run, so that on pytest-xdist's workers (README: -n 3
    # --dist worksteal) no long test is left to run alone at the end while the other workers sit idle.  The
    # sort is stable and the same in every worker (xdist requires identical collections).
    items.sort(key=lambda item: "slow" not in item.keywords)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch  # noqa: F401
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)
