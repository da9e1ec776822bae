"""Depthwise separable against standard convolution: multiply-adds counted, time measured.

    .venv/bin/python benchmarks/bench_mobile.py               # a few seconds
    .venv/bin/python benchmarks/bench_mobile.py --batch 32 --rounds 7

One process, one BLAS thread, float32. For a few MobileNet-like shapes
(C_in -> C_out channels, 3x3 kernel, H x W output) the same input goes
through a standard ``Conv2d(C_in, C_out, 3, padding=1)`` and through the
two convolutions of ``DepthwiseSeparableConv2d`` (depthwise 3x3 with
``groups=C_in``, then pointwise 1x1; batch norm and ReLU left out so only
the convolutions are compared). Each round times a forward and a forward +
backward of both, the order alternating; the table gives the median over
rounds, the multiply-add ratio (= 1/C_out + 1/9) and the time ratio, and
the depthwise half's share of the separable block's multiply-adds and of
its forward time.

Why the time falls less than the arithmetic: the depthwise half does only
9 multiply-adds per input value it loads, so it is bound by memory, not by
the floating-point units; its im2col copy is as large as a standard conv's
per channel; and its matrix products are (1 x 9) @ (9 x H*W) per image and
channel, far too small for BLAS to reach its peak, so per-call overhead
dominates. The pointwise half is a plain GEMM and runs near the speed of
the standard convolution's GEMM per multiply-add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

from minidist import Tensor, nn  # noqa: E402
from minidist.nn import mobile  # noqa: E402
from minidist.runtime.blas_threads import set_blas_threads  # noqa: E402

#: (C_in, C_out, H=W) shapes in the spirit of MobileNet's body, scaled down.
SHAPES = [(32, 64, 28), (64, 128, 14), (128, 128, 14), (256, 256, 7)]


def build(c_in: int, c_out: int):
    nn.init.manual_seed(0)
    standard = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    separable = nn.Sequential(nn.Conv2d(c_in, c_in, 3, padding=1, bias=False, groups=c_in),
                              nn.Conv2d(c_in, c_out, 1, bias=False))
    return standard, separable


def time_once(layer, x, backward: bool) -> float:
    start = time.perf_counter()
    out = layer(x)
    if backward:
        out.backward(np.ones(out.shape, dtype=np.float32))
    return time.perf_counter() - start


def measure(batch: int, rounds: int, shapes=SHAPES) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for c_in, c_out, size in shapes:
        standard, separable = build(c_in, c_out)
        x = Tensor(rng.standard_normal((batch, c_in, size, size)).astype(np.float32), requires_grad=True)
        times = {(name, backward): [] for name in ("standard", "separable") for backward in (False, True)}
        times[("depthwise", False)] = []
        for round_index in range(rounds + 1):  # the first round warms up
            order = [("standard", standard), ("separable", separable)]
            for name, layer in order if round_index % 2 else order[::-1]:
                for backward in (False, True):
                    elapsed = time_once(layer, x, backward)
                    if round_index:
                        times[(name, backward)].append(elapsed)
                    layer.zero_grad()
            if round_index:
                times[("depthwise", False)].append(time_once(separable[0], x, False))
        costs = mobile.compare_costs(c_in, c_out, 3, size, size)
        median = {key: statistics.median(value) for key, value in times.items()}
        rows.append({
            "shape": f"{c_in}->{c_out}, {size}x{size}",
            "standard_madds": costs["standard_multiply_adds"] * batch,
            "separable_madds": costs["separable_multiply_adds"] * batch,
            "madd_ratio": costs["multiply_add_ratio"],
            "standard_forward_ms": 1e3 * median[("standard", False)],
            "separable_forward_ms": 1e3 * median[("separable", False)],
            "standard_step_ms": 1e3 * median[("standard", True)],
            "separable_step_ms": 1e3 * median[("separable", True)],
            "depthwise_madd_share": 9 * c_in * size * size * batch / (costs["separable_multiply_adds"] * batch),
            "depthwise_time_share": median[("depthwise", False)] / median[("separable", False)],
        })
    return rows


def format_table(rows: list[dict], batch: int) -> str:
    lines = [
        f"batch {batch}, 3x3 kernel, float32, 1 BLAS thread; times are medians (ms)",
        f"{'C_in->C_out, HxW':>18} {'MAdds std':>10} {'MAdds sep':>10} {'ratio':>6} | "
        f"{'fwd std':>8} {'fwd sep':>8} {'ratio':>6} | {'f+b std':>8} {'f+b sep':>8} {'ratio':>6} | depthwise share: MAdds, fwd time",
    ]
    for row in rows:
        lines.append(
            f"{row['shape']:>18} {row['standard_madds'] / 1e6:9.1f}M {row['separable_madds'] / 1e6:9.1f}M "
            f"{row['madd_ratio']:6.3f} | {row['standard_forward_ms']:8.2f} {row['separable_forward_ms']:8.2f} "
            f"{row['separable_forward_ms'] / row['standard_forward_ms']:6.3f} | "
            f"{row['standard_step_ms']:8.2f} {row['separable_step_ms']:8.2f} "
            f"{row['separable_step_ms'] / row['standard_step_ms']:6.3f} | "
            f"{100 * row['depthwise_madd_share']:5.1f} %, {100 * row['depthwise_time_share']:5.1f} %"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    set_blas_threads(1)
    print(format_table(measure(args.batch, args.rounds), args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
