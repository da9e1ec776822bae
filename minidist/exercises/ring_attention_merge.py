"""Exercise: the online-softmax merge at the heart of ring attention (lesson 18).

Ring attention (:mod:`minidist.parallel.context.ring_attention`) cuts a sequence
across n ranks and passes the keys and values round a ring: at step s rank
r holds the K, V block of rank r - s, attends its queries to it, and folds
the result into what it has so far. softmax over all keys is never formed:
each query row keeps its output so far O and the log of its softmax
denominator, LSE = log sum_j exp(s_j); a block gives its own (O_b, LSE_b),
and the two merge exactly::

    LSE' = log(exp(LSE) + exp(LSE_b))
    O'   = exp(LSE - LSE') O + exp(LSE_b - LSE') O_b

The student writes that merge, ``merge_block(out, lse, block_out,
block_lse) -> (out, lse)``; the ring calls it at every pair of chunks of
every step of the forward (``ring_attention(..., merge_block=)``, the
hook), the running state starting empty (O = 0, LSE = -inf).

What is checked, on real processes (2 and 4 ranks, float64:
:func:`~.process_check.check_beside_reference`), in three cases: a full
(non-causal) attention over a length that does not split evenly, a causal
one on the zig-zag split, and one whose scores are in the thousands (exp of
them overflows float64). Every merge the ring made, on every rank, against
the reference merge of the same inputs (:class:`~.merge_recorder.MergeRecorder`;
the first wrong one told by its rank, ring step and block, and by what it
looks like: :data:`WEIGHT_MISTAKES`, an overflow, a wrong LSE); then every
rank's output against full attention
(``F.scaled_dot_product_attention`` on the whole sequence), and the
gradients of q, k and v. The merge sits in the forward only: the backward
is ring attention's own, recomputing the probabilities from the saved LSE,
so the gradients check the LSE the student's merges left (an LSE off by
anything makes every probability of its row wrong). A wrong merge is
replayed on the ring (:mod:`viz.ring_attention_replay`), the student's run
beside the reference's, the step of the first wrong merge marked.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.exercises.exercise import Exercise, Failure
from minidist.exercises.merge_recorder import (
    MergeRecorder,
    merge_weights,
    ring_merges,
    weights_are,
)
from minidist.exercises.process_check import (
    check_beside_reference,
    first_wrong,
    forward_backward,
    replay,
    same,
)
from minidist.nn import functional as F
from minidist.parallel.context.ring_attention import merge as _reference_merge
from minidist.parallel.context.ring_attention import ring_attention
from minidist.parallel.context.split import shard_sequence

#: the heads: B sequences, H heads of width D
BATCH, HEADS, WIDTH = 1, 2, 4
SEED = 18
#: values this close are one (blockwise and whole softmax round differently)
RTOL, ATOL = 1e-9, 1e-10
_same = partial(same, rtol=RTOL, atol=ATOL)


def merge_block(out, lse, block_out, block_lse):
    """The reference: the two states' weights are their shares of the new
    denominator, exp(LSE - LSE') and exp(LSE_b - LSE'), both at most 1, so
    nothing overflows (numpy.logaddexp subtracts the larger before its exp).
    Cost: a few passes over the (B, H, L, D) output."""
    out, lse = out.copy(), lse.copy()
    _reference_merge(out, lse, block_out, block_lse)
    return out, lse


@dataclass(frozen=True)
class Case:
    name: str
    causal: bool
    extra: int          # T = 4 n + extra positions (1: chunks of uneven length)
    magnitude: float    # q and k scaled by this: scores of about its square

    def seq_len(self, n: int) -> int:
        return 4 * n + self.extra

    def words(self, n: int) -> str:
        return f"{self.name}: T = {self.seq_len(n)}, {'causal' if self.causal else 'full'}"


CASES = (
    Case("uneven blocks", causal=False, extra=1, magnitude=1.0),
    Case("causal, zig-zag", causal=True, extra=0, magnitude=1.0),
    Case("large scores", causal=False, extra=0, magnitude=40.0),
)
#: what a check that passes has held
PASSED = (f", {len(CASES)} cases ({', '.join(case.name for case in CASES)}): every merge of the "
          "ring equals the reference merge of the same inputs",
          "every rank's output, and the gradients of q, k and v (the backward reads the LSE "
          "your merges left), equal full attention's")

#: the merged output as a out + b block_out, row by row: (kind, a, b, what it
#: means); "old" and "new" stand for the right weights exp(lse - lse') and
#: exp(block_lse - lse')
WEIGHT_MISTAKES = (
    ("averaged", 0.5, 0.5,
     "your output is the average of the old output and the block's (weight 1/2 each): "
     "averaging outputs instead of weighting them by exp(lse). Each state's weight is its "
     "share of the new denominator, exp(lse - lse') for the old and exp(block_lse - lse') for "
     "the block's: a block whose keys score higher counts more, and an empty state "
     "(lse = -inf) counts nothing"),
    ("old not rescaled", 1.0, "new",
     "the old output keeps weight 1 while the block's comes in at exp(block_lse - lse'): the "
     "old output is not rescaled by exp(lse - lse'), so a row's weights sum to more than 1 and "
     "the blocks merged first count too much. The new denominator holds both sets of keys: "
     "rescale the old output by its share of it"),
    ("weighted to the last block", "old", 1.0,
     "outputs weighted toward the last block: the block's output comes in at weight 1 (the "
     "old at exp(lse - lse')), so a row's weights sum to more than 1. Rescale the block's "
     "output too, by exp(block_lse - lse'), its share of the new denominator"),
    ("not rescaled", 1.0, 1.0,
     "your output is the sum of the old output and the block's, each at weight 1: neither is "
     "rescaled. Weight the old by exp(lse - lse') and the block's by exp(block_lse - lse'), "
     "their shares of the new denominator (they sum to 1)"),
    ("replaced", 0.0, 1.0,
     "your output is the block's alone: the old output is dropped, so the result is the "
     "attention over the last block's keys only. Keep the old at weight exp(lse - lse')"),
    ("swapped weights", "new", "old",
     "the weights are swapped: the old output has the block's weight exp(block_lse - lse') and "
     "the block's the old's exp(lse - lse')"),
)


def _problem(index: int, n: int):
    """Case ``index``'s whole q, k, v and the output's gradient, (B, H, T, D)."""
    case = CASES[index]
    generator = np.random.default_rng(SEED + index)
    shape = (BATCH, HEADS, case.seq_len(n), WIDTH)
    q, k, v, grad = (generator.standard_normal(shape) for _ in range(4))
    return q * case.magnitude, k * case.magnitude, v, grad


def _run(merge, index):
    """This rank's shard of case ``index`` through ring attention with
    ``merge``: ((output, (dq, dk, dv), {}), the merges it made)."""
    rank, n, case = dist.get_rank(), dist.get_world_size(), CASES[index]
    q, k, v, grad = (shard_sequence(a, case.seq_len(n), n, rank, axis=2)
                     for a in _problem(index, n))
    recorder = MergeRecorder(merge)
    ran = forward_backward(lambda q, k, v: ring_attention(
        q, k, v, case.seq_len(n), is_causal=case.causal, merge_block=recorder), (q, k, v), grad)
    return ran, recorder.calls


# --------------------------------------------------------------------------- the check


def check(function, **options):
    return check_beside_reference("ring_attention_merge", _run, function, merge_block,
                                  "merge_block", _judge, PASSED, cases=len(CASES))


def _judge(n, index, results, events):
    failure, step = _check_merges(n, index, [calls for _, calls in results])
    if failure is None:
        failure, step = _check_attention(n, index, [got for got, _ in results]), 0
    if failure is None:
        return None
    return failure, _replay(n, events, index, step, failure)


def _check_merges(n, index, calls_per_rank):
    """The first wrong merge (lowest step, then rank): (Failure, step) or (None, None)."""
    case = CASES[index]
    seq_len = case.seq_len(n)
    first = None
    for rank, calls in enumerate(calls_per_rank):
        plan = ring_merges(seq_len, n, rank, case.causal)
        if len(calls) != len(plan):
            return Failure("wrong result", (
                f"on {n} ranks ({case.words(n)}): rank {rank} merged {len(calls)} times, the "
                f"ring merges {len(plan)} times there: does merge_block call itself, or "
                "the ring?"), rank=rank), 0
        for where, (out, lse, block_out, block_lse, got_out, got_lse) in zip(plan, calls):
            want_out, want_lse = merge_block(out, lse, block_out, block_lse)
            if not (_same(got_out, want_out) and _same(got_lse, want_lse)):
                if first is None or where[0] < first[1][0]:
                    first = (rank, where, (out, lse, block_out, block_lse, got_out, got_lse),
                             (want_out, want_lse))
                break
    if first is None:
        return None, None
    rank, (step, owner, query, key), given, wanted = first
    where = (f"on {n} ranks ({case.words(n)}): rank {rank}, ring step {step}, merging rank "
             f"{owner}'s K, V block (keys {key[0]}..{key[1] - 1}) into queries "
             f"{query[0]}..{query[1] - 1}")
    kind, words = _diagnose(*given, *wanted)
    return Failure(kind, f"{where}: {words}", rank=rank, step=step), step


def _diagnose(out, lse, block_out, block_lse, got_out, got_lse, want_out, want_lse):
    """(kind, what it looks like) of one wrong merge."""
    finite = np.concatenate([lse[np.isfinite(lse)], block_lse[np.isfinite(block_lse)]])
    largest = float(finite.max()) if finite.size else float("nan")
    if not (np.all(np.isfinite(got_out)) and np.all(np.isfinite(got_lse) | np.isneginf(want_lse))):
        return "overflow", (
            f"your merge returned inf or nan where the scores are large (an lse of "
            f"{largest:.4g}): exp({largest:.4g}) overflows float64, whose exp is inf past "
            "about 709. Subtract the larger of the two before exponentiating: with "
            "m = max(lse, block_lse), exp(lse - m) and exp(block_lse - m) are at most 1 "
            "(np.logaddexp(lse, block_lse) does it for the new lse)")
    if not _same(got_out, want_out):
        a, b, fits = merge_weights(out, block_out, got_out)
        right = {"old": np.exp(np.where(np.isneginf(lse), -np.inf, lse - want_lse)).reshape(-1),
                 "new": np.exp(block_lse - want_lse).reshape(-1)}
        for kind, old_weight, block_weight, words in WEIGHT_MISTAKES if fits else ():
            if weights_are(a, right.get(old_weight, old_weight)) and \
                    weights_are(b, right.get(block_weight, block_weight)):
                return kind, words
        index = first_wrong(got_out, want_out, RTOL, ATOL)
        return "wrong result", (
            f"the merged output at {index} is {got_out[index]:.6g}, expected "
            f"{want_out[index]:.6g} (exp(lse - lse') O + exp(block_lse - lse') O_b)")
    reason = next((words for value, words in (
        (np.maximum(lse, block_lse), "it is the larger of the two, not their log-sum-exp: the "
         "denominators add, lse' = log(exp(lse) + exp(block_lse)) (np.logaddexp)"),
        (block_lse, "it is the block's alone: the new denominator holds the old keys too"),
        (lse, "it is the old one, unchanged: the block's keys add to the denominator"),
        (lse + block_lse, "it is the sum of the two logs, which multiplies the denominators; "
         "they add: lse' = log(exp(lse) + exp(block_lse))")) if _same(got_lse, value)), None)
    if reason is None:
        index = first_wrong(got_lse, want_lse, RTOL, ATOL)
        reason = f"at {index} it is {got_lse[index]:.6g}, expected {want_lse[index]:.6g}"
    return "wrong lse", (
        f"the output is right but the new lse is not: {reason}. The next merges weigh the "
        "states by it, and the backward recomputes every probability from it")


def _check_attention(n, index, results):
    """Every rank's output and q, k, v gradients against full attention."""
    case = CASES[index]
    seq_len = case.seq_len(n)
    *qkv, grad = _problem(index, n)
    out, grads, _ = forward_backward(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal), qkv, grad)
    wanted = (out, *grads)
    names = ("output", "gradient of q", "gradient of k", "gradient of v")
    for rank, (out, grads, _) in enumerate(results):
        for name, mine, want in zip(names, (out, *grads), wanted):
            want = shard_sequence(np.asarray(want), seq_len, n, rank, axis=2)
            mine = np.asarray(mine)
            if not _same(mine, want):
                where = first_wrong(mine, want, RTOL, ATOL)
                return Failure("wrong result", (
                    f"on {n} ranks ({case.words(n)}): every merge is right, but rank {rank}'s "
                    f"{name} at {where} is {mine[where]:.6g}, full attention's "
                    f"{want[where]:.6g}"), rank=rank)
    return None


def _replay(n, events, index, step, failure):
    """The forward ring of case ``index``, the student's run beside the
    reference's (their trace events; :mod:`viz.exercise_replay` draws them
    with :mod:`viz.ring_attention_replay`), the step of the first wrong merge
    marked (step 0: each rank's own block, before any message)."""
    info = [trace.label_info(e.get("label") or "") for e in events]
    calls = sorted({i.get("ring_attention") for i, e in zip(info, events)
                    if e["kind"] == "send"} - {None})
    if len(calls) != 2 * len(CASES):
        return None
    student, reference = ([e for i, e in zip(info, events) if i.get("phase") == "forward"
                           and i.get("ring_attention") == calls[k]]
                          for k in (index, len(CASES) + index))
    # rank 0's block: with uneven chunks the ranks' blocks differ, and the
    # trace lists the sends as they happened to start
    block = next((e["bytes"] for e in student if e["kind"] == "send" and e["rank"] == 0), 0)
    return replay(n, int(block) // 8, student, reference, step,
                  f"rank {failure.rank}, ring step {step}: the first wrong merge "
                  f"({failure.kind}); the messages are the reference's, the values merged "
                  "are not")


EXERCISE = Exercise(
    name="ring_attention_merge", function="merge_block",
    summary="ring attention's online-softmax merge of a block into the running (out, lse)",
    lesson="lessons/18_long_sequences.py", reference=merge_block, check=check)
