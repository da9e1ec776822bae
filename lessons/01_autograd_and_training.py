# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 1: gradients, gradient descent, and one training loop
#
# Everything later in this course (data parallel, parameter servers, pipelines)
# splits up *one* computation: the training step
#
# 1. **forward**: compute the model's predictions and the loss,
# 2. **backward**: compute the gradient of the loss for every parameter,
# 3. **update**: move every parameter a little against its gradient.
#
# This chapter builds that step from the bottom: a tensor that remembers how it
# was computed, gradient descent on a problem whose answer we know, the three
# ways of choosing the examples of each update (batch gradient descent,
# stochastic gradient descent and mini-batches, section 2 defines them), and
# finally a real network trained on real handwritten digits.
#
# Run it as a script (`python lessons/01_autograd_and_training.py`) or open it
# as a notebook (`jupytext --to notebook lessons/01_autograd_and_training.py`).

# %%
import inspect

import numpy as np

import minidist
from minidist import Tensor, nn, optim
from minidist.data import DataLoader, load_digits, make_linear_regression
from minidist.lesson import (
    glue,
    in_notebook,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.lesson_timing import timed

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
if QUICK:
    print("quick form: 3 passes over the regression data instead of 10 (30 instead of 100 "
          "for batch GD), 50 timing repeats per batch size instead of 200, and 5 epochs of "
          "the digits network instead of 20")

# %% [markdown]
# ## 1. A tensor that remembers
#
# `Tensor(..., requires_grad=True)` marks a value we want the gradient for.
# Each operation records its inputs and its *local* derivative; `backward()`
# applies the chain rule from the result back to the inputs.
#
# For $y = x^2 + 3x$ the derivative is $dy/dx = 2x + 3$, so at $x = 2$ it is 7.

# %%
x = Tensor(2.0, requires_grad=True)
y = x * x + 3 * x
y.backward()
print("y =", y.item(), " dy/dx =", x.grad)
assert np.isclose(x.grad, 7.0)

# %% [markdown]
# The same works for whole arrays. Take a 2x3 matrix $P$ and a 3x4 matrix
# $Q$, and $f(P) = \sum_{ij} (PQ)_{ij}$, the sum of all entries of their
# product. Its gradient with respect to $P$ is $\mathbf{1}\,Q^T$, where
# $\mathbf{1}$ is the 2x4 matrix of ones: entry $(i, j)$ of the gradient is
# the sum of row $j$ of $Q$, the same in every row $i$.
#
# Any gradient can be checked numerically with a *finite difference*: move
# one entry $P_{ij}$ by a small $\epsilon$ (here $10^{-6}$) up and down and
# see how much $f$ moves,
# $\partial f/\partial P_{ij} \approx (f(P + \epsilon E_{ij}) - f(P - \epsilon E_{ij})) / 2\epsilon$,
# where $E_{ij}$ is the matrix with a 1 at $(i, j)$ and zeros elsewhere.
# The code checks the first $f$ against $\mathbf{1}\,Q^T$, then a harder
# one, $f(P) = \sum_{ij} \tanh(PQ)_{ij}$, against finite differences.

# %%
rng = np.random.default_rng(0)
P = Tensor(rng.standard_normal((2, 3)), requires_grad=True)  # float64, for an exact check
Q = Tensor(rng.standard_normal((3, 4)))
(P @ Q).sum().backward()
print("gradient of sum(P Q):\n", P.grad)
assert np.allclose(P.grad, np.ones((2, 4)) @ Q.data.T)
P.grad = None

f = (P @ Q).tanh().sum()
f.backward()

eps = 1e-6
numeric = np.zeros_like(P.data)
for i in range(2):
    for j in range(3):
        plus, minus = P.data.copy(), P.data.copy()
        plus[i, j] += eps
        minus[i, j] -= eps
        numeric[i, j] = (np.tanh(plus @ Q.data).sum() - np.tanh(minus @ Q.data).sum()) / (2 * eps)
print("gradient of sum(tanh(P Q)), autograd:\n", P.grad, "\nfinite differences:\n", numeric)
assert np.allclose(P.grad, numeric, atol=1e-6)

# %% [markdown]
# ## 2. Gradient descent on a problem with a known answer
#
# Linear regression: $y = x\,w^* + b^* + \text{noise}$, with true weights $w^*$
# and bias $b^*$ we know, and a noise of standard deviation 0.1 (`NOISE` in
# the code below). The loss is the mean squared error
# $L(w, b) = \frac{1}{B}\sum_i (x_i w + b - y_i)^2$ over the $B$ examples
# $x_i$ of a batch, and gradient descent repeats $w \leftarrow w - \eta\,\nabla_w L$.
#
# Three ways to choose *which* examples the gradient is computed on, out of
# the 512 of the data set:
#
# * **batch gradient descent**: all of them per update ($B$ = 512): exact gradient, one update per pass over the data;
# * **stochastic gradient descent (SGD)**: one example per update ($B$ = 1): 512 noisy updates per pass;
# * **mini-batch SGD**: $B$ examples per update, in between, and what everyone uses.

# %%
features = 10
NOISE = 0.1
x_data, y_data, w_true, b_true = make_linear_regression(n_samples=512, n_features=features, noise=NOISE, seed=1)


def train_linear(batch_size, lr, epochs):
    """Mini-batch SGD on the regression; returns the full-data loss after every update."""
    w = Tensor(np.zeros(features, np.float32), requires_grad=True)
    b = Tensor(np.zeros((), np.float32), requires_grad=True)
    history = []
    for epoch in range(epochs):
        for xb, yb in DataLoader((x_data, y_data), batch_size=batch_size, shuffle=True, seed=epoch):
            loss = ((Tensor(xb) @ w + b - Tensor(yb)) ** 2).mean()
            w.grad = b.grad = None
            loss.backward()
            with minidist.no_grad():
                w.data -= lr * w.grad
                b.data -= lr * b.grad
            full = float(((x_data @ w.data + b.data - y_data) ** 2).mean())
            history.append(full)
    return w, history


epochs = 3 if QUICK else 10
# Batch GD makes one update per pass over the data, the others 16 and 512:
# it gets ten times the passes, so that it too makes enough updates to converge.
runs = {
    "batch GD (B = 512)": train_linear(512, 0.1, epochs * 10),
    "mini-batch (B = 32)": train_linear(32, 0.05, epochs),
    "SGD (B = 1)": train_linear(1, 0.01, epochs),
}
for name, (w, history) in runs.items():
    print(f"{name:22s} updates {len(history):5d}  final loss {history[-1]:.4f}  "
          f"|w - w*| = {np.linalg.norm(w.data - w_true):.3f}")

TARGET = round(2 * NOISE ** 2, 6)  # twice the floor the noise sets: 0.02


def first_below(history, target=TARGET):
    """The number of updates after which the loss was first at most ``target``."""
    return next(step for step, loss in enumerate(history, start=1) if loss <= target)


reached = {}  # name -> (updates, examples read) until the loss was first <= TARGET
for name, (_, history) in runs.items():
    batch = int(name.split("= ")[1].rstrip(")"))
    updates = first_below(history)
    reached[name] = (updates, updates * batch)
    print(f"{name:22s} loss <= {TARGET} after {updates:4d} updates, "
          f"{updates * batch:5d} examples read")

(gd_updates, gd_read), (mini_updates, mini_read), (sgd_updates, sgd_read) = reached.values()
glue("reached", [[name, *counts] for name, counts in reached.items()])
glue("epochs", epochs, "d")
glue("gd_epochs", 10 * epochs, "d")
glue("noise", NOISE, "g")
glue("floor", NOISE ** 2, "g")
glue("target", TARGET, "g")
# How often each curve goes up by more than 1%: a smooth descent hardly ever
# does, a noisy one at many of its updates. (At the floor the loss still moves
# in its last digits, float32 rounding: that is not what the eye sees as noise.)
rises = {name: float(np.mean(np.asarray(history[1:]) > 1.01 * np.asarray(history[:-1])))
         for name, (_, history) in runs.items()}
glue("rises", [[name, share] for name, share in rises.items()])
short = {name: name.split(" (")[0] for name in runs}    # "batch GD", "mini-batch", "SGD"
smooth = {short[name]: share for name, share in rises.items() if share < 0.05}
noisy = {short[name]: share for name, share in rises.items() if share >= 0.05}


def curves(shares, what):
    names = " and ".join(f"{name}'s" for name in shares)
    percents = " and ".join(f"{share:.0%}" for share in shares.values())
    return (f"{names} {'curve is' if len(shares) == 1 else 'curves are'} {what} "
            f"(the loss rose by more than 1% at {percents} of the updates)")


glue("smooth_text", "; ".join(curves(group, what) for group, what in
                              ((smooth, "smooth"), (noisy, "noisy")) if group))
first = min(reached, key=lambda name: reached[name][0])
glue("first_curve", short[first])
glue("farthest_w", max(np.linalg.norm(w.data - w_true) for w, _ in runs.values()), ".3f")
glue("gd_updates", gd_updates, "d")
glue("sgd_updates", sgd_updates, "d")
glue("updates_verdict", "the fastest" if gd_updates < min(mini_updates, sgd_updates)
     else "not the fastest here")
glue("read_ratio", gd_read / sgd_read, "{:.0f} times")
glue("read_verdict", "sooner" if sgd_read < min(gd_read, mini_read) else "not sooner here")
between = (min(gd_updates, sgd_updates) <= mini_updates <= max(gd_updates, sgd_updates)
           and min(gd_read, sgd_read) <= mini_read <= max(gd_read, sgd_read))
glue("mini_verdict", "sit in between on both counts" if between
     else "do not sit in between on both counts in this run")

# %% jupyter={"source_hidden": true}
say(r"""
Batch GD ran {glue}`gd_epochs` passes over the data, the others
{glue}`epochs`: one update per pass would give it too few. Every method finds
weights close to $w^*$ (at most {glue}`farthest_w` away; the noise, of
standard deviation {glue}`noise`, sets the floor of the loss at about its
square, {glue}`floor`). Counted in
*updates*, batch GD is {glue}`updates_verdict`: its gradient is exact, so it
reaches twice the floor ({glue}`target`) in {glue}`gd_updates` updates, where SGD needs
{glue}`sgd_updates`. But each of batch GD's updates reads all 512 examples:
counted in *examples read*, the work a computer does, SGD gets there
{glue}`read_ratio` {glue}`read_verdict`, on a noisy path. Mini-batches
{glue}`mini_verdict`. In the picture below (against updates)
{glue}`smooth_text`; the first to reach twice the floor is {glue}`first_curve`.
""")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for name, (_, history) in runs.items():
    ax.plot(np.arange(1, len(history) + 1), history, label=name)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("updates")
ax.set_ylabel("mean squared error on all data")
ax.set_title("Batch GD vs mini-batch vs SGD on linear regression")
ax.legend()
fig.tight_layout()
show_figure(fig, "01_gd_vs_sgd.png")

# %% [markdown]
# ### Why not always batch size 1? The hardware.
#
# A processor does a matrix product of 256 rows far faster than 256 products
# of one row: it loads each weight once for all the rows, and its vector
# units work on many at a time. So we expect the time per example to fall as
# the batch grows, until the hardware is busy. This is the first reason for
# mini-batches, and later the reason data parallel training wants a *large
# global* batch (lesson 6 shows its price, and the rules that pay it).

#
# The batches are timed the way lesson 2 explains: taking turns, many short
# repeats each, keeping the fastest (a repeat the operating system
# interrupted is slower, never faster), with one BLAS thread (BLAS, the
# Basic Linear Algebra Subprograms, is the library NumPy hands its matrix
# products to; it may use several threads, which would time the threads, not
# the batch), and the machine's load read before and after.

# %%
layer = nn.Linear(64, 256)
BATCHES = (1, 8, 64, 256)
steps = {}
for batch in BATCHES:
    inputs = Tensor(rng.standard_normal((batch, 64)).astype(np.float32))
    steps[batch] = lambda inputs=inputs: layer(inputs).relu().sum().backward()
timing = timed(steps, repeats=50 if QUICK else 200)
per_example = {batch: timing.best[batch] / batch for batch in BATCHES}
for batch in BATCHES:
    print(f"batch {batch:4d}: {1e6 * per_example[batch]:8.2f} microseconds per example")
print(f"batch 256 spends {per_example[1] / per_example[256]:.0f}x less time per example "
      f"than batch 1 ({timing.load.describe()})")
note = timing.load.note("each number is the fastest of its repeats, so the comparison holds "
                        "if one repeat of each ran undisturbed")
if note:
    print(note)

smallest, largest = BATCHES[0], BATCHES[-1]
glue("per_example_us", [[batch, 1e6 * per_example[batch]] for batch in BATCHES])
glue("per_example_1", 1e6 * per_example[smallest], "{:.2f} us")
glue("per_example_256", 1e6 * per_example[largest], "{:.2f} us")
fell = per_example[largest] < per_example[smallest]
glue("batch_verdict", "fell" if fell else "rose")
glue("batch_change", per_example[smallest] / per_example[largest] if fell
     else per_example[largest] / per_example[smallest], "{:.0f} times less" if fell
     else "{:.1f} times more")
# Where a larger batch was *slower* per example than the one before it.
reversals = [(small, large) for small, large in zip(BATCHES, BATCHES[1:])
             if per_example[large] >= per_example[small]]
glue("reversals", [list(pair) for pair in reversals])
if not reversals:
    steps = "It fell at every step, from each batch size to the next."
else:
    slower = "; ".join(f"batch {large} took {1e6 * per_example[large]:.2f} us per example "
                       f"against {1e6 * per_example[small]:.2f} us at batch {small}"
                       for small, large in reversals)
    steps = (f"It did not fall at every step: {slower}. "
             "A larger batch can be slower per example on a given machine: "
             "its arrays may no longer fit in the processor's cache, "
             "the BLAS library may switch to another kernel for the larger shape, "
             f"or another program may have taken the core during its repeats "
             f"({timing.load.describe()}). "
             "The trend over the whole range is what the hardware gives; "
             "one step of it depends on the machine and the moment.")
glue("steps", steps)

# %% jupyter={"source_hidden": true}
say(r"""
On this run the time per example {glue}`batch_verdict` from {glue}`per_example_1` at
batch 1 to {glue}`per_example_256` at batch 256: {glue}`batch_change`. {glue}`steps`
""")

# %% [markdown]
# ## 3. One training loop, written out
#
# The bundled data set: 1,797 handwritten digits of 8x8 pixels (UCI, via
# scikit-learn), split once and for all into 1,442 training and 355 test images.
# A multilayer perceptron with one hidden layer, cross-entropy loss, SGD with
# momentum. The step is the function `train_step` in the code of this
# section, printed below with the loop's settings (the constants `BATCH_SIZE`,
# `HIDDEN`, `LR`, `MOMENTUM` and `EPOCHS` at the top of the section's code).

# %%
BATCH_SIZE, HIDDEN, LR, MOMENTUM = 64, 128, 0.1, 0.9
EPOCHS = 5 if QUICK else 20

x_train, y_train, x_test, y_test = load_digits()
print("train", x_train.shape, "test", x_test.shape, "(images, pixels)")

model = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
loss_fn = nn.CrossEntropyLoss()


def train_step(xb, yb):
    logits = model(Tensor(xb))          # 1. forward
    loss = loss_fn(logits, yb)
    optimizer.zero_grad()               # gradients accumulate, so clear them
    loss.backward()                     # 2. backward
    optimizer.step()                    # 3. update
    return loss.item()


print(f"64 pixels -> {HIDDEN} hidden (ReLU) -> 10 digits; batch size {BATCH_SIZE}, "
      f"learning rate {LR}, momentum {MOMENTUM}, {EPOCHS} epochs")
if not in_notebook():  # the notebook shows the code itself
    print(inspect.getsource(train_step))


def accuracy(model, x, y):
    model.eval()
    with minidist.no_grad():
        predictions = model(Tensor(x)).data.argmax(axis=1)
    model.train()
    return float((predictions == y).mean())


print(f"before training: test accuracy {accuracy(model, x_test, y_test):.3f} (chance is 0.1)")
for epoch in range(EPOCHS):
    losses = [train_step(xb, yb) for xb, yb in
              DataLoader((x_train, y_train), batch_size=BATCH_SIZE, shuffle=True, seed=epoch)]
    if epoch % 2 == 0 or epoch == EPOCHS - 1:
        print(f"epoch {epoch:2d}  loss {np.mean(losses):.4f}  test accuracy {accuracy(model, x_test, y_test):.3f}")

final = accuracy(model, x_test, y_test)
assert final > 0.9, final

# %% [markdown]
# ## What to take away
#
# * The training step is forward, backward, update. Backward does about twice
#   the forward's arithmetic (two matrix products per layer instead of one).
# * Mini-batches trade the exactness of batch GD for many cheap updates, and
#   keep the hardware busy.
# * The gradient of a mini-batch is an *average over examples*. That is the
#   property data parallel training exploits: split the batch over workers,
#   average their gradients, and you have the gradient of the whole batch.
#
# **Try it:** change the constant `BATCH_SIZE` in the code of section 3 to 1
# and to 1,442 and compare accuracy after the same number of epochs; run
# `minidist train --model cnn` for a convolutional network.
