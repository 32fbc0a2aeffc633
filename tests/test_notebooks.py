"""Every notebook in notebooks/ executes without error (TR_NOTEBOOK_FAST=1 sizes) and is stored without outputs.

The kernel is this interpreter (the project's venv): a kernelspec pointing at
``sys.executable`` is installed into a temp folder put first on JUPYTER_PATH,
so a system-wide ``python3`` kernel can never be picked up instead, and the
repository root is put first on the kernel's PYTHONPATH so the notebooks
import this working tree.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "tr-model-venv"

nbformat = pytest.importorskip("nbformat", reason="nbformat is a test extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is a test extra")
pytest.importorskip("ipykernel", reason="ipykernel is a test extra")


def test_the_three_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_delayed_batching_r2r.ipynb", "02_profile_to_thresholds.ipynb",
            "03_algorithms_and_sensitivity.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for k, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
                f"{path.name} cell {k} has stored outputs; clear them before committing"
            src = "".join(cell["source"])
            # logic lives in the packages (tr_model.plots, tr_model.sensitivity, ...), not in notebooks
            assert not re.search(r"^\s*(def|class) ", src, re.M), f"{path.name} cell {k} defines a function or class"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("jupyter")
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", KERNEL,
                    "--display-name", "tr-model venv"], check=True, capture_output=True)
    spec = json.loads((prefix / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json").read_text())
    assert os.path.realpath(spec["argv"][0]) == os.path.realpath(sys.executable)
    old = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "TR_NOTEBOOK_FAST", "MPLBACKEND", "PYTHONPATH")}
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(prefix / "share" / "jupyter"),
                                                               old["JUPYTER_PATH"]]))
    os.environ["TR_NOTEBOOK_FAST"] = "1"
    # the kernel imports this working tree, whatever an editable install elsewhere points at
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old["PYTHONPATH"]]))
    os.environ.pop("MPLBACKEND", None)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=240,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{str(e)[-3000:]}")
    # every code cell ran and nothing was written as an error output
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None
            assert not [o for o in cell.outputs if o.get("output_type") == "error"]
