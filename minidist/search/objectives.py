"""The objective the lesson, the tests and the benchmark search: the digits MLP.

A trial trains a 64 -> hidden -> 10 MLP on 80 % of the digits' training set
for a few epochs of momentum SGD with the trial's learning rate, momentum,
hidden size and weight decay, and returns its accuracy on the other 20 %
(the *validation* split). The test set is never looked at: picking the best
of many trials by their test accuracy would make that accuracy an optimistic
estimate; it is kept for the one model the search finally picks.

After each epoch the validation accuracy is reported (``trial.report``) so
that a pruner can stop a hopeless trial early. One trial (10 epochs of
batches of 8, 16 to 128 hidden units) is a fraction of a second on one core
(``benchmarks/bench_search.py`` times it).
"""

from __future__ import annotations

import numpy as np

from minidist import Tensor, nn, optim
from minidist.data import DataLoader, load_digits
from minidist.search.random_search import TrialPruned
from minidist.search.space import Int, LogUniform, Uniform
from minidist.train import evaluate

#: The space of the lesson: a learning rate over four factors of ten (the
#: low end trains far too slowly in a few epochs: the pruner's food).
DIGITS_SPACE = {
    "lr": LogUniform(1e-4, 1.0),
    "momentum": Uniform(0.0, 0.95),
    "hidden": Int(16, 128, log=True),
    "weight_decay": LogUniform(1e-6, 1e-2),
}

VALIDATION_FRACTION = 0.2


def digits_split(seed: int = 0):
    """(x_train, y_train, x_validation, y_validation): the training set cut in
    two by a fixed permutation (the same for every trial)."""
    x, y = load_digits()[:2]
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(round(len(x) * (1 - VALIDATION_FRACTION)))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def digits_mlp(hidden: int, seed: int) -> nn.Module:
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train_digits_trial(trial, epochs: int = 10, batch_size: int = 8, data=None,
                       return_model: bool = False):
    """Train with ``trial.params`` (lr, momentum, hidden, weight_decay), report
    the validation accuracy after every epoch, return the last one (and the
    trained model, with ``return_model=True``). Missing parameters take the
    defaults of ``minidist train``."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    params = trial.params
    x_train, y_train, x_valid, y_valid = data if data is not None else digits_split()
    model = digits_mlp(int(params.get("hidden", 128)), trial.seed)
    optimizer = optim.SGD(model.parameters(), lr=params.get("lr", 0.1),
                          momentum=params.get("momentum", 0.9),
                          weight_decay=params.get("weight_decay", 1e-4))
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader((x_train, y_train), batch_size=batch_size, shuffle=True,
                        seed=trial.seed)
    accuracy = 0.0
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = loss_fn(model(Tensor(xb)), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, x_valid, y_valid)
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise TrialPruned(f"pruned after epoch {epoch} at accuracy {accuracy:.3f}")
    return (accuracy, model) if return_model else accuracy


__all__ = ["DIGITS_SPACE", "digits_split", "digits_mlp", "train_digits_trial"]
