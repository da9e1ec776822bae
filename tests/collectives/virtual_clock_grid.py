"""The grid of simulated runs whose results are frozen in
``virtual_clock_frozen.json`` (made from the code before the three virtual
clocks were merged into :mod:`minidist.distributed.virtual_clock`):
``test_virtual_clock.py`` checks that they do not change by one bit.

Regenerate (only on purpose, when a timing model changes):
``python -m tests.collectives.virtual_clock_grid > tests/collectives/virtual_clock_frozen.json``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

WORLD_SIZES = (1, 2, 3, 5, 8, 12)
SIZES = (0, 4_000, 100_000_000)
PARAMS = ({}, {"alpha": 1e-6, "beta": 3e-10, "gamma": 0.0},
          {"alpha": 0.0, "beta": 1e-9, "gamma": 5e-10})


def _digest(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:20]


def simulate_grid():
    """name -> (time, clocks digest, messages, bytes, events digest), floats as hex."""
    from minidist.distributed.collectives import ALGORITHMS
    from minidist.distributed.simulator import simulate

    out = {}
    for collective, algorithms in ALGORITHMS.items():
        for algorithm in algorithms:
            for n in WORLD_SIZES:
                for nbytes in SIZES:
                    for index, params in enumerate(PARAMS):
                        if index and (nbytes != 100_000_000 or n not in (5, 8)):
                            continue
                        key = f"{collective}/{algorithm}/n{n}/N{nbytes}/p{index}"
                        try:
                            result = simulate(collective, algorithm, n, nbytes,
                                              trace=(n == 5), root=n // 2, **params)
                        except Exception as error:  # noqa: BLE001 - frozen as it is
                            out[key] = f"{type(error).__name__}: {error}"
                            continue
                        out[key] = [result.time.hex(), _digest([c.hex() for c in result.clocks]),
                                    result.messages, float(result.bytes).hex(),
                                    _digest(result.events)]
    return out


def schedule_grid():
    """name -> digest of simulate_schedule's events (and the bubble fraction)."""
    from minidist.parallel.pipeline.schedules import make_schedule
    from minidist.parallel.pipeline.simulate import (
        DeadlockError,
        bubble_fraction,
        simulate_schedule,
    )

    out = {}
    runs = []
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 2),
                    ("interleaved", 3)):
        for p in (1, 2, 3, 4, 5):
            for m in (1, 2, 4, 6, 8):
                runs.append((name, p, m, v))
    options = ({}, {"transfer_time": 0.25}, {"recompute": True, "optimizer_time": 0.5,
                                             "message_bytes": 64, "activation_bytes": 10},
               {"forward_time": lambda stage, mb: 1.0 + 0.1 * stage + 0.01 * mb,
                "backward_time": lambda stage, mb: 2.0 + 0.3 * stage, "transfer_time": 0.1})
    for name, p, m, v in runs:
        schedule = make_schedule(name, p, m, v)
        for index, option in enumerate(options):
            key = f"{name}/p{p}/m{m}/v{v}/o{index}"
            try:
                events = simulate_schedule(schedule, **option)
            except (DeadlockError, ValueError) as error:
                out[key] = f"{type(error).__name__}: {error}"
                continue
            try:
                bubble = bubble_fraction(events).hex()
            except ValueError as error:
                bubble = str(error)
            out[key] = [_digest(events), len(events), bubble]
    return out


def main() -> None:
    np.seterr(all="ignore")
    grids = {"simulate": simulate_grid(), "schedules": schedule_grid()}
    lines = []
    for name, grid in grids.items():  # one entry a line: diffs stay readable
        entries = ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}"
                              for key, value in sorted(grid.items()))
        lines.append(f" {json.dumps(name)}: {{\n{entries}\n }}")
    print("{\n" + ",\n".join(lines) + "\n}")


if __name__ == "__main__":
    main()
