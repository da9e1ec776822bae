"""Exercise ring_attention_merge: the online-softmax merge of ring attention.

Check it with `minidist exercise check ring_attention_merge`: the checker
runs ring attention on 2 and 4 real processes with your merge inside it,
and compares every merge, every output and the gradients with full
attention over the whole sequence.

The ring (built for you, minidist.parallel.context.ring_attention). A sequence of
T positions is cut across n ranks; each rank holds the queries, keys and
values of its positions. Attention needs every query against every key,
but no rank ever holds all the keys: in step s rank r holds the K, V block
of rank r - s, attends its queries to that block alone, and passes the
block on to rank r + 1. After n steps each query has met every key, one
block at a time.

softmax over all the keys is never formed. For each query row the ring
keeps the attention over the keys seen so far:

* out, the output so far: softmax over those keys, times their values;
* lse, the log of that softmax's denominator: log sum_j exp(s_j) over the
  scores s_j of those keys.

A block gives the same two things over its own keys alone, block_out and
block_lse. Your function merges them into the attention over both sets of
keys. Before the first block the state is empty: out = 0 and lse = -inf
(no key, a denominator of 0).

Think about what the merged softmax is. Its denominator holds both sets of
keys; each set's share of it is exp(its lse) over the whole. The old
output was normalised by the old denominator only, the block's by the
block's only: each must be re-weighted by its share of the new one. And
the scores can be large (thousands): exp of anything above about 709 is
inf in float64, so never exponentiate an lse on its own; exponentiate
differences that are at most 0.

Available inside: numpy (np.logaddexp(a, b) is log(exp(a) + exp(b)),
computed without overflow).
"""

import numpy as np  # noqa: F401

from minidist.exercises import NotWrittenYet


def merge_block(out, lse, block_out, block_lse):
    """Return (out, lse) after merging the block into the running state.

    out, block_out: float64 arrays (B, H, L, D), one output row per query;
    lse, block_lse: float64 arrays (B, H, L), one log-sum-exp per query.
    lse may be -inf (the state is empty: no key merged yet). You get your
    own copies: change them in place and return them, or return new arrays
    of the same shapes.

    The ring calls this at every step (once per pair of chunks its split
    computes), on every rank; the backward pass recomputes the attention
    probabilities from the last lse you return, so it must be exact too.

    Cost to reach: a few passes over the (B, H, L, D) output, nothing of
    size L x (keys), and no overflow for any finite scores.
    """
    raise NotWrittenYet("write merge_block: what share of the merged softmax's denominator "
                        "does each of the two states hold?")
