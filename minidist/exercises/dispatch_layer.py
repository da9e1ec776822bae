"""The layer the moe_dispatch exercise runs: one rank's share of a
mixture-of-experts under expert parallelism, whose dispatch and combine are
the student's function.

An :class:`~minidist.parallel.expert.dispatch.ExpertParallelMoE` routes its
own tokens as usual (the router, the capacity, the gating around the
experts are the layer's own); where it would send the rows to their
experts' ranks and back, it calls the student's
``moe_dispatch(x, choices, kept, n_expert, experts)`` with the routing of
this rank's tokens and an ``experts(rows, local_expert)`` that runs this
rank's experts on what arrived, recording what they were given. A raise in
the student's function is told as in the dispatch or in the combine (before
or after the experts ran). What the layer must give instead is the whole
MoE's on one process (:func:`one_process`); :func:`whose_row` finds which
token of which rank a row that arrived is. Costs: the layer's own, plus
what the student's function sends.
"""

from __future__ import annotations

import numpy as np

from minidist.exercises.exercise import NotWrittenYet, describe_error
from minidist.models.moe import route, run_experts
from minidist.parallel.expert.dispatch import ExpertParallelMoE
from minidist.tensor import Tensor, no_grad


class StudentDispatch(ExpertParallelMoE):
    """This rank's share of the MoE, whose dispatch and combine are the
    student's function: it gets the routing and the rows, and an
    ``experts(rows, local_expert)`` that runs this rank's experts (and
    records what they were given, for the checker)."""

    def __init__(self, moe, function):
        super().__init__(moe)
        self.function, self.arrivals, self.answer, self.ran = function, [], None, False

    def forward(self, x):
        self.tokens = np.array(x.data if isinstance(x, Tensor) else x, dtype=np.float64)
        return super().forward(x)

    def run_local(self, rows, local_expert):
        local = self.expert_stop - self.expert_start
        rows = np.asarray(rows)
        local_expert = np.asarray(local_expert)
        if rows.ndim != 2 or rows.shape[1] != self.tokens.shape[1]:
            raise ValueError(f"experts(rows, local_expert) needs rows of shape (M, "
                             f"{self.tokens.shape[1]}), the rows that arrived here; got "
                             f"{rows.shape}")
        if local_expert.shape != (rows.shape[0],) or local_expert.size and (
                not np.issubdtype(local_expert.dtype, np.integer)
                or local_expert.min() < 0 or local_expert.max() >= local):
            raise ValueError(f"experts(rows, local_expert) needs one int per row, 0 to "
                             f"{local - 1}: this rank's experts {self.expert_start}.."
                             f"{self.expert_stop - 1} counted from 0; got {local_expert!r:.80}")
        with no_grad():
            outputs = np.array(run_experts(self.experts, Tensor(rows.astype(np.float64)),
                                           local_expert).data)
        self.arrivals.append((rows.copy(), local_expert.copy(), outputs.copy()))
        self.ran = True
        return outputs

    def experts_on(self, rows, expert):
        probs = self.router(Tensor(self.tokens)).softmax(axis=-1).data
        routing = route(probs, self.top_k, self.capacity_factor)   # the forward's own routing
        try:
            answer = self.function(self.tokens.copy(), routing.choices.copy(),
                                   routing.kept.copy(), self.n_expert, self.run_local)
        except NotWrittenYet:
            raise
        except Exception as error:
            stage = ("in the combine (after your experts ran)" if self.ran
                     else "in the dispatch (before your experts ran)")
            raise RuntimeError(f"{stage}: {describe_error(error)}") from error
        self.answer = None if answer is None else np.array(answer, dtype=np.float64)
        token, which = routing.order()
        wanted = routing.choices.shape + (self.tokens.shape[1],)
        if self.answer is None or self.answer.shape != wanted:
            return Tensor(np.zeros((token.size, self.tokens.shape[1])))  # told by the checker
        return Tensor(self.answer[token, which])


def one_process(moe, tokens):
    """What the layer must give on one rank's tokens: the whole ``moe`` on
    them, on one process: (its routing, its output, each choice's expert
    output, zeros for a dropped choice)."""
    with no_grad():
        y = np.array(moe(Tensor(tokens)).data)
        routing = moe.routing
        outputs = np.zeros(routing.choices.shape + (tokens.shape[1],))
        for t, w in zip(*np.nonzero(routing.kept)):
            expert = moe.experts[int(routing.choices[t, w])]
            outputs[t, w] = expert(Tensor(tokens[t:t + 1])).data[0]
    return routing, y, outputs


def whose_row(row, tokens_per_rank):
    """(rank, token) of the token whose row ``row`` is, or None."""
    for rank, tokens in enumerate(tokens_per_rank):
        hit = np.flatnonzero(np.all(tokens == row, axis=1))
        if hit.size:
            return rank, int(hit[0])
    return None
