"""Every notebook in ``notebooks/`` runs top to bottom on the CPU, and is stored without outputs.

Each notebook executes in a fresh kernel of *this* interpreter (a kernelspec written to a temporary
``JUPYTER_PATH`` whose argv is ``sys.executable``), with ``notebooks/`` as its working directory, so it
imports the toolkit exactly as a user's kernel in this environment would. A failing cell fails the test with
that cell's source and traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL_NAME = "terra-notebook-test"
CELL_TIMEOUT_S = int(os.environ.get("TERRA_NOTEBOOK_CELL_TIMEOUT", "300"))
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _ids(paths):
    return [p.stem for p in paths]


def test_notebooks_present():
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "custom_trajectory.ipynb"} <= names, f"notebooks/ holds only {sorted(names)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_stored_without_outputs(path: Path):
    """Notebooks are committed clean: no outputs, no execution counts (strip them before committing)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs or execution counts; clear them before committing"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """A ``JUPYTER_PATH`` entry with a kernelspec that runs ipykernel on this very interpreter."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, kernel_dir: Path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(kernel_dir), os.environ.get("JUPYTER_PATH")])))
    # One BLAS/OpenMP thread unless told otherwise: on a small shared CPU, several threads per process
    # spin against each other and slow generation down by an order of magnitude.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the notebooks' CPU path, whatever the machine
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences the debugger warning on stderr
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    assert spec.argv[0] == sys.executable

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except CellExecutionError as err:  # its text holds the cell's source and traceback
        failure = f"{path.name}: a cell failed\n{ANSI.sub('', str(err))}"
    except (CellTimeoutError, DeadKernelError) as err:
        failure = f"{path.name}: {type(err).__name__} (cell timeout {CELL_TIMEOUT_S} s): {ANSI.sub('', str(err))}"
    if failure:  # reported outside the except block: no chained nbclient traceback
        pytest.fail(failure, pytrace=False)
    elapsed = time.perf_counter() - start
    print(f"{path.name}: executed in {elapsed:.1f} s")
    errors = [
        out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs if out.output_type == "error"
    ]
    assert not errors, f"{path.name}: error outputs {errors}"
    warned = [out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "stream" and "IProgress not found" in out.get("text", "")]
    assert not warned, f"{path.name}: tqdm's notebook bars need ipywidgets (the notebooks extra): {warned[0][:200]}"


def test_readme_notebook_commands_are_installed_by_the_notebooks_extra():
    """README runs a notebook into a file with its outputs (nbconvert) and opens them in JupyterLab: the
    notebooks extra installs both, and ipywidgets for the notebooks' progress bars."""
    import tomllib

    readme = (NOTEBOOK_DIR.parent / "README.md").read_text()
    assert "jupyter nbconvert --to html --execute notebooks/quickstart.ipynb" in readme
    assert "jupyter lab notebooks/" in readme and "pip install -e '.[notebooks]'" in readme
    extra = tomllib.loads((NOTEBOOK_DIR.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[]", req)[0] for req in extra["notebooks"]}
    assert {"jupyterlab", "nbconvert", "ipywidgets", "ipykernel"} <= names
