"""Collective algorithms of minidist next to MPICH and gloo, nccl-tests style.

    .venv/bin/python benchmarks/bench_collectives.py            # full run, a few minutes
    .venv/bin/python benchmarks/bench_collectives.py --quick    # a smoke run

The same as ``minidist bench collectives`` (see ``--help``), writing
``benchmarks/results/collectives.json`` unless ``--json`` says otherwise.
The engine is :mod:`minidist.bench.collectives`, inside the package so that
the installed ``minidist`` command can run it; this file only starts it.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

from minidist.bench.collectives import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_json=os.path.join(HERE, "results", "collectives.json")))
