"""Parallel batch inference gives exactly the single-process predictions, in order,
on OpenBLAS's default kernels and on its Haswell ones (where a row's rounding
depends on its place in the batch and on the BLAS thread count)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from minidist.data import load_digits
from minidist.nn.quantization import quantize
from minidist.parallel.data.inference import parallel_predict, predict, shard_bounds
from minidist.runtime.blas_threads import openblas_cores
from minidist.train import build_model


@pytest.mark.parametrize("batch_size", [1, 4, 32])
@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 355])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_shards_are_whole_batches_dealt_in_order(count, world_size, batch_size):
    bounds = shard_bounds(count, world_size, batch_size)
    assert len(bounds) == world_size and bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:]))
    assert all(start % batch_size == 0 for start, stop in bounds if start < count)
    batches = [-(-(stop - start) // batch_size) for start, stop in bounds]
    assert sum(batches) == -(-count // batch_size)
    assert max(batches) - min(batches) <= 1 and batches == sorted(batches, reverse=True)


# One launch per case, batch 32. 355 test digits divide by none of 2, 3, 4
# (split by examples, every shard boundary would fall inside a batch); three
# examples on four ranks leave three ranks without any, and put a single
# example in a padded batch, the shape that makes OpenBLAS add in another order.
@pytest.mark.blas_kernel
@pytest.mark.parametrize("world_size, count, output, int8", [
    (1, 355, "logits", False), (2, 355, "logits", False), (3, 355, "labels", False),
    (4, 355, "logits", False), (4, 3, "logits", False), (2, 355, "logits", True),
])
def test_parallel_predictions_equal_single_process_bit_for_bit(world_size, count, output, int8):
    x_train, _, x_test, _ = load_digits(flatten=False)
    model = build_model("cnn", seed=3)
    if int8:
        model = quantize(model, x_train[:128])
    model.train()
    console = Console(record=True, width=100, color_system=None, file=open("/dev/null", "w"))
    x = x_test[:count]
    expected = predict(model, x, batch_size=32, output=output)
    got = parallel_predict(model, x, world_size=world_size, batch_size=32, output=output,
                           progress=not int8, console=console)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert (got == expected).all()
    assert model.training  # predicted in eval mode, and the flag restored
    if output == "logits":
        assert got.shape == (count, 10)
        assert (predict(model, x, batch_size=32, output="labels") == got.argmax(axis=1)).all()
    if not int8:
        assert f"{count}/{count}" in console.export_text()


def _haswell_kernels_here() -> bool:
    """Whether OPENBLAS_CORETYPE=Haswell can take effect: NumPy on an x86-64
    OpenBLAS (the variable is read by its builds for several CPUs, such as
    NumPy's wheels) and a CPU with the AVX2 and FMA that those kernels use."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not openblas_cores():
        return False
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return {"avx2", "fma"} <= flags


# In a fresh interpreter, because OpenBLAS picks its kernels when it loads.
# Two ranks on 355 digits in batches of 32, float32 and int8: with shards cut
# by examples (rank 1 from digit 178, inside a batch) or with the parent's
# BLAS threads in predict(), Haswell's kernels give logits that differ in
# the last bits.
_ON_KERNEL = """
from minidist.data import load_digits
from minidist.nn.quantization import quantize
from minidist.parallel.data.inference import parallel_predict, predict
from minidist.runtime.blas_threads import openblas_cores
from minidist.train import build_model
x_train, _, x_test, _ = load_digits(flatten=False)
model = build_model("cnn", seed=3)
for name, net in (("float32", model), ("int8", quantize(model, x_train[:128]))):
    same = (parallel_predict(net, x_test, world_size=2, batch_size=32, progress=False)
            == predict(net, x_test, batch_size=32)).all()
    print(name, "same" if same else "DIFFER")
print("kernels", *openblas_cores())
"""


@pytest.mark.skipif(not _haswell_kernels_here(), reason="OpenBLAS's Haswell kernels cannot run here")
def test_parallel_predictions_equal_single_process_on_haswell_kernels():
    ran = subprocess.run([sys.executable, "-c", _ON_KERNEL], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OPENBLAS_CORETYPE="Haswell"))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n")[:3] == ["float32 same", "int8 same", "kernels Haswell"], ran.stdout


def test_bad_arguments_are_named():
    model = build_model("mlp")
    x = np.zeros((5, 64), np.float32)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        parallel_predict(model, x, world_size=0, progress=False)
    with pytest.raises(ValueError, match="at least one example"):
        parallel_predict(model, x[:0], world_size=2, progress=False)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        predict(model, x, batch_size=0)
    with pytest.raises(ValueError, match=r"output must be one of \('logits', 'labels'\)"):
        predict(model, x, output="probabilities")
    with pytest.raises(TypeError, match="needs a minidist.nn.Module"):
        predict(lambda x: x, x)


def test_predict_command_reports_the_same_predictions_and_one_line_errors():
    import subprocess
    import sys

    def run_cli(*args):
        return subprocess.run([sys.executable, "-m", "minidist.cli", "predict", *args],
                              capture_output=True, text=True, timeout=120)

    ran = run_cli("--model", "mlp", "-n", "2", "--epochs", "2", "--copies", "1", "--int8",
                  "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("predictions equal the single-process ones bit for bit") == 2
    assert "int8: the 2-process" in ran.stdout
    # The int8 row is many times slower than float32's, and the command says why, in one line.
    why = [line for line in ran.stdout.splitlines() if line.startswith("int8 predicted")]
    assert len(why) == 1 and "NumPy has no int8 matrix product kernel" in why[0], ran.stdout
    for args, message in ((("-n", "0"), "-n must be at least 1, got 0"),
                          (("--batch-size", "-3"), "--batch-size must be at least 1, got -3")):
        wrong = run_cli(*args)
        assert wrong.returncode == 2
        assert wrong.stderr.strip() == f"minidist predict: error: {message}"


def test_the_int8_line_says_how_much_slower_and_why():
    from minidist.commands import int8_speed_line

    slow = int8_speed_line(0.010, 0.552)
    assert slow.startswith("int8 predicted 55.2x slower than float32 on 1 process: ")
    assert "NumPy has no int8 matrix product kernel" in slow and "\n" not in slow
    even = int8_speed_line(0.010, 0.0105)
    assert "slower" not in even and "NumPy has no int8 matrix product kernel" in even
