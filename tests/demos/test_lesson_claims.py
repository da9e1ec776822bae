"""What lessons 1-8 say, held: each test computes, small and on fixed seeds
or on the simulator, the direction of a comparison a lesson's text states,
and checks that the text still states it that way. (Running whole lessons
is tests/demos/test_lessons.py's job; these take seconds.)"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import minidist
from minidist import Tensor, nn
from minidist.data import DataLoader, make_linear_regression
from minidist.lesson_timing import timed

LESSONS = Path(__file__).resolve().parents[2] / "lessons"


def text_of(number: int) -> str:
    """The lesson's Markdown, lines joined and spaces squeezed, for phrase searches."""
    path = next(LESSONS.glob(f"{number:02d}_*.py"))
    lines = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ")]
    return re.sub(r"\s+", " ", " ".join(lines))


def says(number: int, phrase: str) -> bool:
    return re.sub(r"\s+", " ", phrase) in text_of(number)


# ------------------------------------------------------------------ lesson 1

def _linear_regression_losses(batch_size, lr, epochs):
    """Lesson 1's regression (512 examples, 10 features, noise 0.1, seed 1),
    trained as it trains it: the full-data loss after every update."""
    x, y, _, _ = make_linear_regression(n_samples=512, n_features=10, noise=0.1, seed=1)
    w = Tensor(np.zeros(10, np.float32), requires_grad=True)
    b = Tensor(np.zeros((), np.float32), requires_grad=True)
    losses = []
    for epoch in range(epochs):
        for xb, yb in DataLoader((x, y), batch_size=batch_size, shuffle=True, seed=epoch):
            loss = ((Tensor(xb) @ w + b - Tensor(yb)) ** 2).mean()
            w.grad = b.grad = None
            loss.backward()
            with minidist.no_grad():
                w.data -= lr * w.grad
                b.data -= lr * b.grad
            losses.append(float(((x @ w.data + b.data - y) ** 2).mean()))
    return losses


def test_lesson_1_batch_gd_needs_fewer_updates_and_sgd_fewer_examples():
    def first_below(losses, target=0.02):
        return next(step for step, loss in enumerate(losses, start=1) if loss <= target)

    batch_gd = first_below(_linear_regression_losses(512, 0.1, 30))
    sgd = first_below(_linear_regression_losses(1, 0.01, 1))
    assert batch_gd < sgd / 5                 # updates: batch GD far ahead
    assert sgd * 1 < batch_gd * 512 / 5       # examples read: SGD far ahead
    assert says(1, "Counted in *updates*, batch GD is the fastest")
    assert says(1, "counted in *examples read*, the work a computer does, SGD gets there")
    assert not says(1, "needs many updates")


def test_lesson_1_a_large_batch_spends_less_time_per_example():
    rng = np.random.default_rng(0)
    layer = nn.Linear(64, 256)
    inputs = {batch: Tensor(rng.standard_normal((batch, 64)).astype(np.float32))
              for batch in (1, 256)}
    timing = timed({batch: (lambda x=x: layer(x).relu().sum().backward())
                    for batch, x in inputs.items()}, repeats=20)
    per_example = {batch: timing.best[batch] / batch for batch in inputs}
    assert per_example[256] < per_example[1] / 4, (per_example, timing.load)
    assert says(1, "Time per example falls as the batch grows")
