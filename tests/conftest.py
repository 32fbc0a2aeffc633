import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


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
