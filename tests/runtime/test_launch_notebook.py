"""minidist.launch from a Jupyter kernel: a worker function defined in a cell.

A notebook kernel is a process with threads of its own (ZeroMQ, heartbeat),
which is exactly where fork-based launchers tend to hang; this runs a real
kernel through nbclient."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CELLS = [
    "import numpy as np\nimport minidist\nimport minidist.distributed as dist",
    "scale = 3.0  # notebook state the worker closes over\n"
    "def worker():\n"
    "    x = np.full(4, dist.get_rank() * scale)\n"
    "    if dist.get_rank() == 0:\n"
    "        dist.recv_reduce(x, 1)\n"
    "    else:\n"
    "        dist.send(x, 0)\n"
    "    return x.tolist()",
    "results = minidist.launch(worker, world_size=2, transport='shm')\nprint(results)",
    "print(minidist.launch(lambda: dist.get_rank(), world_size=3, transport='pipe'))",
]


@pytest.mark.timeout(120)
def test_launch_from_a_notebook_cell():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    client = nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3",
                                     resources={"metadata": {"path": ROOT}})
    client.execute()
    # What the cells printed (stderr carries warnings, such as more ranks than cores).
    outputs = ["".join(output.get("text", "") for output in cell.outputs
                       if output.get("name") != "stderr")
               for cell in notebook.cells]
    assert outputs[2].strip() == "[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]"
    assert outputs[3].strip() == "[0, 1, 2]"
