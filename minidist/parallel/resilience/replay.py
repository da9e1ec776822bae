"""The check of fault-tolerant data parallel: one process replays the quorums.

Whatever failed during a run, its result must be a training one process
could have done: step after step, the optimizer applied to the mean of the
members' gradients, each member's gradient a mean over its own batch. Every
commit records its quorum (:class:`~.fault_tolerant_ddp.CommitRecord`: the
step, the quorum id, the members, each member's batch indices), so
:func:`replay` takes the records and trains the same model alone:

    weights after step s = optimizer step on  (1 / n_s) sum_{m in Q_s} g_m(batch_m)

A step applied twice, a lost update, a dead replica's stale gradient
counted or a division by the world size instead of the live count makes the
run's weights differ from the replay's at the step where it happened.

:class:`RegressionProblem` is the small problem the tests, the chaos script
and the benchmark train (a linear layer, a mean squared error, float64 so
that the comparison can be tight); :func:`train` is its rank's program.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import Tensor, nn, optim
from minidist.parallel.resilience.fault_tolerant_ddp import (
    FaultTolerantDDP,
    Manager,
    OptimizerWrapper,
    model_and_optimizer_state,
)


@dataclass(frozen=True)
class RegressionProblem:
    """``examples`` points of ``features`` inputs and ``outputs`` targets; each
    step's global batch is ``batch`` consecutive examples, split over the
    quorum's members by replica rank (member r of n takes every n-th)."""

    steps: int = 8
    examples: int = 96
    features: int = 6
    outputs: int = 3
    batch: int = 12
    optimizer: str = "sgd"
    lr: float = 0.05
    seed: int = 0

    def data(self):
        rng = np.random.default_rng(self.seed)
        inputs = rng.standard_normal((self.examples, self.features))
        targets = inputs @ rng.standard_normal((self.features, self.outputs)) \
            + 0.1 * rng.standard_normal((self.examples, self.outputs))
        return inputs, targets

    def batch_indices(self, step: int, replica_rank: int, replicas: int) -> np.ndarray:
        start = (step * self.batch) % self.examples
        window = (np.arange(self.batch) + start) % self.examples
        return window[replica_rank::replicas]

    def model_and_optimizer(self):
        model = nn.Linear(self.features, self.outputs, rng=np.random.default_rng(self.seed + 1),
                          dtype=np.float64)
        if self.optimizer == "sgd":
            optimizer = optim.SGD(model.parameters(), lr=self.lr, momentum=0.9)
        elif self.optimizer == "adamw":
            optimizer = optim.AdamW(model.parameters(), lr=self.lr, weight_decay=0.01)
        else:
            raise ValueError(f"RegressionProblem optimizer is 'sgd' or 'adamw', not "
                             f"{self.optimizer!r}")
        return model, optimizer

    def loss(self, model, indices, inputs, targets):
        error = model(Tensor(inputs[indices])) - Tensor(targets[indices])
        return (error * error).mean()


def train(problem: RegressionProblem, replicas: int, fault=None, spare_joins_after: int = 1):
    """One rank's program: fault-tolerant DDP on ``problem``. Returns (the
    manager's result, {step: the weights after it}, as this rank applied them)."""
    inputs, targets = problem.data()
    model, optimizer = problem.model_and_optimizer()
    state_dict, load_state_dict = model_and_optimizer_state(model, optimizer)
    manager = Manager(state_dict=state_dict, load_state_dict=load_state_dict,
                      replicas=replicas, total_steps=problem.steps,
                      spare_joins_after=spare_joins_after,
                      batch_indices=problem.batch_indices, fault=fault)
    ddp = FaultTolerantDDP(manager, model)
    wrapped = OptimizerWrapper(manager, optimizer)
    weights = {}
    while not manager.finished():
        wrapped.zero_grad()
        step = manager.current_step()
        if manager.is_participating():
            problem.loss(ddp, manager.batch(), inputs, targets).backward()
        if wrapped.step():
            weights[step] = [p.data.copy() for p in model.parameters()]
    # A step undone after it was applied here is redone: the weights above
    # are overwritten then. Keep only the steps this rank holds as committed.
    held = {record.step for record in manager.history}
    return manager.result(), {step: w for step, w in weights.items() if step in held}


def replay(problem: RegressionProblem, history) -> list:
    """The weights after each step of ``history`` (CommitRecords, in order),
    trained by one process on the members' batches."""
    inputs, targets = problem.data()
    model, optimizer = problem.model_and_optimizer()
    parameters = list(model.parameters())
    after = []
    for expected, record in enumerate(history):
        if record.step != expected:
            raise ValueError(f"the history's record {expected} is of step {record.step}: "
                             "a step is missing or recorded twice")
        total = [np.zeros_like(p.data) for p in parameters]
        for member in record.members:
            optimizer.zero_grad()
            problem.loss(model, np.asarray(record.batches[member]), inputs, targets).backward()
            for summed, parameter in zip(total, parameters):
                summed += parameter.grad
        for summed, parameter in zip(total, parameters):
            parameter.grad = summed / len(record.members)
        optimizer.step()
        after.append([p.data.copy() for p in parameters])
    return after
