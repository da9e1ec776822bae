"""``minidist bench``: measurements of minidist next to the libraries it imitates.

* :mod:`.collectives`  every collective algorithm, nccl-tests style (time,
  algbw, busbw), next to MPICH (mpi4py) and PyTorch's gloo, and the cost model;
* :mod:`.native`       the MPICH and gloo sides, run as their own processes;
* :mod:`.timing`       the timing loop all three sides share;
* :mod:`.common`       machine info, mpiexec, sizes.

The engines live in the package (not in ``benchmarks/``) so that the installed
``minidist`` command can run them; ``benchmarks/*.py`` are thin scripts.
This module stays light: the command line reads its argument definitions
without importing the engines.
"""

from __future__ import annotations

import argparse

DEFAULT_SIZES = "4KiB-256MiB"
DEFAULT_WORLD_SIZES = "2,4,8"


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """'4KiB-256MiB' -> 4 KiB, 16 KiB, ... 256 MiB (times ``factor``);
    '4KiB,1MiB' -> those sizes."""
    from minidist.costmodel import parse_size

    sizes: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = (parse_size(end) for end in part.split("-", 1))
            if low < 1 or high < low:
                raise ValueError(f"size range {part!r} must go from a positive size up, "
                                 "like 4KiB-256MiB")
            if factor < 2:
                raise ValueError(f"--factor must be at least 2, got {factor}")
            size = low
            while size <= high:
                sizes.append(size)
                size *= factor
        else:
            sizes.append(parse_size(part))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"no usable sizes in {text!r}: give a range like 4KiB-256MiB or a "
                         "list like 4KiB,1MiB")
    return sorted(set(sizes))


def parse_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


def add_collectives_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``minidist bench collectives`` and benchmarks/bench_collectives.py."""
    parser.add_argument("--collectives", default=None,
                        help="comma list, e.g. all_reduce,broadcast (default: every collective "
                             "minidist has)")
    parser.add_argument("--algorithms", default=None,
                        help="comma list of algorithm names to keep, e.g. ring,binomial "
                             "(default: all)")
    parser.add_argument("--sizes", default=None,
                        help=f"bytes per call: a range like {DEFAULT_SIZES} (times --factor) or "
                             "a list like 4KiB,1MiB; float32 elements")
    parser.add_argument("--factor", type=int, default=4,
                        help="step between sizes of a range (default 4)")
    parser.add_argument("--world-sizes", default=None,
                        help=f"comma list of rank counts (default {DEFAULT_WORLD_SIZES})")
    parser.add_argument("--transport", default="shm",
                        help="minidist transport(s): shm, pipe or shm,pipe (default shm)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run, under 30 s: all_reduce (every algorithm) at 4 KiB, "
                             "1 MiB and 64 MiB on 2 and 4 ranks, short timing (--collectives, "
                             "--sizes, --world-sizes still choose)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed calls per case (default: adaptive, about 0.1 s per case)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed calls before timing (default: 1 to 5 by size)")
    parser.add_argument("--no-mpich", action="store_true", help="skip the MPICH (mpi4py) column")
    parser.add_argument("--no-gloo", action="store_true", help="skip the torch gloo column")
    parser.add_argument("--params", default=None, metavar="P2P_JSON",
                        help="take alpha and beta for the cost model from this "
                             "benchmarks/bench_p2p.py result instead of fitting them in "
                             "this run")
    parser.add_argument("--no-fit", action="store_true",
                        help="predict with costmodel.PARAMS instead of alpha, beta, gamma "
                             "fitted in this run (the default: a shared machine's speed "
                             "drifts, so a fit from another hour mispredicts)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write everything measured, with machine info, to FILE")
