"""Pictures a lesson draws from its own numbers, kept here so that a test can
draw each of them with small inputs and check its text stays readable
(tests/viz/test_pictures_text.py). A lesson calls the function and prints
the path; what the picture shows is explained in the lesson."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from minidist.atomic_file import atomic_path


def _workers_axis(axis) -> None:
    """A log axis of workers with plain numbers at 2, 4, 8, ...: matplotlib's
    own minor labels (3x10^0, 4x10^0, ...) run into each other."""
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_locator(LogLocator(base=2))
    axis.xaxis.set_major_formatter(ScalarFormatter())
    axis.xaxis.set_minor_formatter(NullFormatter())


def draw_ps_bandwidth(traffic, parameter_bytes: int, steps: int, path, *,
                      link_bytes_per_s: float = 10e9, max_workers: int = 64) -> str:
    """Lesson 7's ``ps_bandwidth.png``: on the left, the bytes per step at the
    busiest rank for one server (n N), two servers (n N / 2) and a ring rank
    (2 (n-1)/n N) against the workers n (N: the gradient's bytes,
    ``parameter_bytes``; lessons/NOTATION.md), with the measured points (``traffic``
    rows ``(who, workers, servers, received, ...)``, ``received`` over
    ``steps`` steps); on the right, the least time that traffic takes on links
    of ``link_bytes_per_s``. Returns the PNG's path."""
    ws = np.arange(2, max_workers + 1)
    p = parameter_bytes
    figure = Figure(figsize=(11, 4))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    axes[0].plot(ws, ws * p / 1e3, label="one server: n N")
    axes[0].plot(ws, ws * p / 2 / 1e3, label="each of 2 servers: n N / 2")
    axes[0].plot(ws, 2 * (ws - 1) / ws * p / 1e3, label="one ring rank: 2 (n-1)/n N")
    named = set()  # each kind of point named once in the legend
    for _, workers, servers, received, *_ in traffic:
        marker, colour, who = (("o", "C0", "one server") if servers == 1
                               else ("D", "C1", f"{servers} servers") if servers
                               else ("s", "C2", "a ring rank"))
        axes[0].plot([workers], [received / steps / 1e3], marker, color=colour,
                     label=None if who in named else f"measured: {who}")
        named.add(who)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("kB received per step")
    axes[0].set_title("bytes per step at the busiest rank\n(points: measured from the traces)")
    link = link_bytes_per_s
    axes[1].plot(ws, ws * p / link * 1e6, label="one server")
    axes[1].plot(ws, ws * p / 2 / link * 1e6, label="2 servers")
    axes[1].plot(ws, 2 * (ws - 1) / ws * p / link * 1e6, label="ring")
    axes[1].set_ylabel("us per step, receive side")
    axes[1].set_title(f"the least time a step's traffic takes\non {link / 1e9:g} GB/s links")
    for axis in axes:
        _workers_axis(axis)
        axis.set_xlabel("workers n")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3, which="both")
    figure.tight_layout()
    path = os.fspath(path)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=100)
    return path


__all__ = ["draw_ps_bandwidth"]
