"""Parallel batch inference gives exactly the single-process predictions, in order."""

import numpy as np
import pytest
from rich.console import Console

from minidist.data import load_digits
from minidist.nn.quantization import quantize
from minidist.parallel.inference import parallel_predict, predict, shard_bounds
from minidist.train import build_model


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 355])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_shards_are_contiguous_and_differ_by_at_most_one(count, world_size):
    bounds = shard_bounds(count, world_size)
    assert len(bounds) == world_size and bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:]))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


# One launch per case. 355 test digits divide by none of 2, 3, 4; three
# examples on four ranks leave one rank without any, and put a single example
# in a batch, the shape that makes OpenBLAS add in another order.
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
    for args, message in ((("-n", "0"), "-n must be at least 1, got 0"),
                          (("--batch-size", "-3"), "--batch-size must be at least 1, got -3")):
        wrong = run_cli(*args)
        assert wrong.returncode == 2
        assert wrong.stderr.strip() == f"minidist predict: error: {message}"
