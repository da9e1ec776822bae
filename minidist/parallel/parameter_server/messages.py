"""What a parameter-server worker and server say to each other.

A worker's request to a server is a small header, :class:`Request` (push
step, version, examples, pull step, done), followed, when it pushes, by the
gradient slice; a pull is answered by a header (version, step) and the
weight slice. Each kind travels under its own tag, and everything in the
parameter server's own message context, so that no message of the user's
can match one of them.

A push carries the version of the weights it was computed on and its
identity ``(worker, step)`` (:class:`Push`), ``step`` being the worker's
last step in it: with ``n_push > 1`` a worker sums several steps'
gradients (:class:`PendingPush`) and pushes them as one, with the version
of the oldest. Messages are labelled for the trace with
``kind=push|pull|update``, ``worker``, ``step`` and ``version`` (read them
back with :func:`minidist.trace.label_info`).

Cost: a request is one message of ``HEADER_SIZE`` int64s, and with a push a
second, the server's slice of the gradient; a reply is two messages, two
int64s and the server's slice of the weights. Read after :mod:`.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import trace

REQUEST_TAG, GRADIENT_TAG, REPLY_TAG, WEIGHTS_TAG = 1, 2, 3, 4
NO_STEP = -1


@dataclass(frozen=True)
class Request:
    """What a worker asks of one server in one message: push a gradient
    (``push_step >= 0``), send weights for a step (``pull_step >= 0``),
    or both; ``done`` says it is the worker's last request."""

    push_step: int = NO_STEP
    base_version: int = NO_STEP
    examples: int = 0
    pull_step: int = NO_STEP
    done: bool = False

    def encode(self) -> np.ndarray:
        return np.array([self.push_step, self.base_version, self.examples, self.pull_step,
                         int(self.done)], np.int64)

    @classmethod
    def decode(cls, header: np.ndarray) -> Request:
        push_step, base_version, examples, pull_step, done = (int(v) for v in header)
        return cls(push_step, base_version, examples, pull_step, bool(done))


HEADER_SIZE = 5


@dataclass
class Push:
    """One gradient pushed by ``worker`` after its step ``step``: its identity
    is ``(worker, step)``."""

    worker: int
    step: int
    base_version: int
    examples: int
    gradient: np.ndarray

    @property
    def identity(self) -> tuple[int, int]:
        return (self.worker, self.step)


class PendingPush:
    """The gradients a worker has summed since its last push (``n_push`` steps
    of them in async), their examples, and the versions the first was computed on."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.summed, self.examples, self.base_versions = None, 0, None

    def add(self, gradient: np.ndarray, examples: int, versions) -> None:
        if self.summed is None:
            self.summed, self.base_versions = np.array(gradient, copy=True), list(versions)
        else:
            self.summed += gradient
        self.examples += examples


def _push_label(worker: int, step: int, version: int) -> str:
    return trace.with_info("push", kind="push", worker=worker, step=step, version=version)
