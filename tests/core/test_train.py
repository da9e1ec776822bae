"""Single-process training on the bundled digits, and the command line."""

import subprocess
import sys

import pytest
from rich.console import Console

from minidist.train import build_model, train_digits


def quiet_console():
    return Console(record=True, width=100, color_system=None, file=open("/dev/null", "w"))


def test_a_short_run_learns():
    result = train_digits("mlp", epochs=3, progress=False, console=quiet_console())
    history = result["history"]
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert result["test_accuracy"] > 0.6  # chance is 0.1


@pytest.mark.parametrize("model, target", [("mlp", 0.95), ("cnn", 0.97)])
def test_default_training_reaches_the_promised_accuracy(model, target):
    result = train_digits(model, progress=False, console=quiet_console())
    assert result["test_accuracy"] >= target, result["test_accuracy"]


def test_same_seed_same_model_different_seed_different_model():
    a, b, c = build_model("mlp", seed=1), build_model("mlp", seed=1), build_model("mlp", seed=2)
    first = [p.data for p in a.parameters()]
    assert all((x == y).all() for x, y in zip(first, [p.data for p in b.parameters()]))
    assert not all((x == y).all() for x, y in zip(first, [p.data for p in c.parameters()]))


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="unknown model"):
        train_digits("resnet", progress=False)
    with pytest.raises(ValueError, match="epochs >= 1"):
        train_digits("mlp", epochs=0, progress=False)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "minidist.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_help_and_train():
    help_text = run_cli("--help")
    assert help_text.returncode == 0
    for command in ("train", "run", "demo"):
        assert command in help_text.stdout
    trained = run_cli("train", "--model", "mlp", "--epochs", "2", "--no-progress")
    assert trained.returncode == 0, trained.stderr
    assert "test accuracy" in trained.stdout
    wrong = run_cli("train", "--model", "transformer")
    assert wrong.returncode != 0 and "invalid choice" in wrong.stderr


def test_training_runs_on_one_blas_thread_and_restores_the_count(monkeypatch):
    import minidist.train as train_module
    from minidist.runtime.blas_threads import blas_threads

    before = blas_threads()
    seen = []
    real = train_module.set_blas_threads

    def record(count):
        seen.append(count)
        return real(count)

    monkeypatch.setattr(train_module, "set_blas_threads", record)
    train_digits("mlp", epochs=1, progress=False, console=quiet_console())
    assert blas_threads() == before
    if before:  # a BLAS library NumPy loaded whose thread count can be set
        assert seen == [1, max(before.values())]
    with pytest.raises(ValueError, match="threads must be a positive int"):
        train_digits("mlp", epochs=1, progress=False, threads=0)


def test_the_progress_line_fits_80_columns_and_shows_no_nan():
    """The first frame, before any batch has a loss, says "loss -", not nan."""
    import io
    import re

    screen = io.StringIO()
    train_digits("mlp", epochs=1, console=Console(file=screen, force_terminal=True, width=80))
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # no escape codes
    frames = [line for line in re.split(r"[\r\n]", drawn) if line.startswith("epoch")]
    assert frames and "loss -" in frames[0], frames[:2]
    assert not any("nan" in frame for frame in frames), frames
    assert all(len(frame) <= 80 and "…" not in frame for frame in frames), frames
    assert re.search(r"loss \d\.\d{4}  train acc \d\.\d{3}", frames[-1]), frames[-1]


def test_the_progress_line_keeps_its_batch_count_whole_in_a_pipe():
    """Written to a file or a pipe (make demo's output) at 80 columns, the
    last line shows the batches done of all whole, never cut with "…"."""
    import io
    import re

    screen = io.StringIO()   # make demo's 20 epochs: 460 batches, three digits each side
    train_digits("mlp", epochs=20, console=Console(file=screen, width=80))
    lines = [line for line in screen.getvalue().splitlines() if line.startswith("epoch")]
    assert lines and all(len(line) <= 80 and "…" not in line for line in lines), lines
    assert re.search(r" (\d+)/\1 loss \d\.\d{4}  train acc", lines[-1]), lines[-1]
