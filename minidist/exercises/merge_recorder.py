"""The student's merges as the ring_attention_merge exercise sees them:
recorded where ring attention calls them, named by the ring's order, and
read as the weights they gave their two inputs.

:func:`~minidist.parallel.context.ring_attention.ring_attention` takes the
function that folds one block's (out, lse) into a query chunk's running
state (``merge_block=``). :class:`MergeRecorder` is that function for the
student's merge: it calls it on copies of the four arrays, checks that it
returns the merged pair, writes it into the ring's state, and keeps every
call's inputs and answer, so that the checker can hold each merge against
the reference's on the same inputs. :func:`ring_merges` lists the merges a
rank makes, in the ring's order, to name each recorded call by its ring
step and blocks. :func:`merge_weights` reads a merged output as
a O + b O_b row by row (least squares), which tells most wrong merges
apart: the right weights are exp(LSE - LSE') and exp(LSE_b - LSE').
Costs: a copy of the arrays a merge reads and writes; a few passes over
them to read the weights.
"""

from __future__ import annotations

import numpy as np

from minidist.parallel.context.split import SKIP, pair_kind, rank_chunks


class MergeRecorder:
    """The hook the ring calls: the student's merge on copies of its
    arguments, every call's inputs and answer kept in ``calls``."""

    def __init__(self, function):
        self.function, self.calls = function, []

    def __call__(self, out, lse, block_out, block_lse):
        given = tuple(np.array(a, dtype=np.float64, copy=True) for a in
                      (out, lse, block_out, block_lse))
        with np.errstate(all="ignore"):   # an overflow is told by the checker, not warned
            answer = self.function(*(a.copy() for a in given))
        new_out, new_lse = _unpack(answer, out.shape, lse.shape)
        self.calls.append(given + (new_out.copy(), new_lse.copy()))
        out[...] = new_out
        lse[...] = new_lse


def _unpack(answer, out_shape, lse_shape):
    wanted = f"a pair (out, lse) of shapes {out_shape} and {lse_shape}"
    if not isinstance(answer, tuple) or len(answer) != 2:
        got = type(answer).__name__ + (f" of {len(answer)}" if isinstance(answer, (tuple, list))
                                       else "")
        raise TypeError(f"merge_block returned {got}, expected {wanted}: return the merged "
                        "state (the arrays you were given, changed in place, or new ones)")
    out, lse = (np.asarray(a, dtype=np.float64) for a in answer)
    if out.shape != out_shape or lse.shape != lse_shape:
        raise TypeError(f"merge_block returned shapes {out.shape} and {lse.shape}, expected "
                        f"{wanted}: one output row of width D and one lse per query")
    return out, lse


def ring_merges(seq_len: int, n: int, rank: int, causal: bool):
    """The merges ``rank`` makes, in the ring's order: (step, owner of the
    K, V block, query positions, key positions) for each pair of chunks
    computed (as :class:`minidist.parallel.context.ring_attention._Ring` walks them)."""
    found = []
    for step in range(n):
        owner = (rank - step) % n
        for query in rank_chunks(seq_len, n, rank):
            for key in rank_chunks(seq_len, n, owner):
                if pair_kind(query, key, causal) != SKIP:
                    found.append((step, owner, query, key))
    return found


def merge_weights(out, block_out, got):
    """Per row, the (a, b) with got = a out + b block_out (least squares);
    a is nan where out is all zero (the state was empty)."""
    o, p, g = (np.reshape(x, (-1, x.shape[-1])) for x in (out, block_out, got))
    oo, op, pp = (o * o).sum(1), (o * p).sum(1), (p * p).sum(1)
    og, pg = (o * g).sum(1), (p * g).sum(1)
    det = oo * pp - op * op
    empty = oo == 0
    with np.errstate(all="ignore"):
        a = np.where(empty, np.nan, (og * pp - pg * op) / det)
        b = np.where(empty, pg / pp, (pg * oo - og * op) / det)
    fits = np.allclose(np.where(empty[:, None], 0, a[:, None]) * o + b[:, None] * p, g,
                       rtol=1e-6, atol=1e-9)
    return a, b, fits


def weights_are(values, want) -> bool:
    """``values`` (nan where unknown) equal ``want`` wherever known."""
    known = ~np.isnan(values)
    want = np.broadcast_to(want, values.shape)
    return not known.any() or bool(np.allclose(values[known], want[known], rtol=1e-6,
                                                  atol=1e-9))
