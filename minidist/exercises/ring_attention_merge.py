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

What is checked, on real processes (2 and 4 ranks, shared memory, float64,
one launch per world size with every case inside): three cases, a full
(non-causal) attention over a length that does not split evenly, a causal
one on the zig-zag split, and one whose scores are in the thousands (exp of
them overflows float64). Every merge the ring made, on every rank, against
the reference merge of the same inputs (the first wrong one is told by its
rank, ring step and block, and by what it looks like: the old output not
rescaled, the block's output at weight 1, an average, an overflow, a wrong
LSE); then every rank's output against full attention
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

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked
from minidist.nn import functional as F
from minidist.parallel.context.ring_attention import merge as _reference_merge
from minidist.parallel.context.ring_attention import ring_attention
from minidist.parallel.context.split import SKIP, pair_kind, rank_chunks, shard_sequence
from minidist.tensor import Tensor

WORLD_SIZES = (2, 4)
TRANSPORT = "shm"
#: the heads: B sequences, H heads of width D
BATCH, HEADS, WIDTH = 1, 2, 4
SEED = 18
#: values this close are one (blockwise and whole softmax round differently)
RTOL, ATOL = 1e-9, 1e-10


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


def _problem(index: int, n: int):
    """Case ``index``'s whole q, k, v and the output's gradient, (B, H, T, D)."""
    case = CASES[index]
    generator = np.random.default_rng(SEED + index)
    shape = (BATCH, HEADS, case.seq_len(n), WIDTH)
    q, k, v, grad = (generator.standard_normal(shape) for _ in range(4))
    return q * case.magnitude, k * case.magnitude, v, grad


def schedule(seq_len: int, n: int, rank: int, causal: bool):
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


# --------------------------------------------------------------------------- the run


class _Recorder:
    """The hook the ring calls: the student's merge on copies of its
    arguments, every call's inputs and answer kept for the checker."""

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


def _run(q, k, v, grad, case, seq_len, merge):
    """(output, dq, dk, dv) of this rank's shard through ring attention."""
    q, k, v = (Tensor(a, requires_grad=True) for a in (q, k, v))
    with trace.region("forward"):
        out = ring_attention(q, k, v, seq_len, is_causal=case.causal, merge_block=merge)
    with trace.region("backward"):
        out.backward(grad)
    return np.array(out.data), np.array(q.grad), np.array(k.grad), np.array(v.grad)


def _worker(function):
    rank, n = dist.get_rank(), dist.get_world_size()
    shards = []
    for index, case in enumerate(CASES):
        seq_len = case.seq_len(n)
        shards.append([shard_sequence(a, seq_len, n, rank, axis=2)
                       for a in _problem(index, n)])
    results = []
    with trace.region("yours"):
        for case, shard in zip(CASES, shards):
            recorder = _Recorder(function)
            results.append((_run(*shard, case, case.seq_len(n), recorder), recorder.calls))
    with trace.region("reference"):   # the same launch: its ring, for the replay
        for case, shard in zip(CASES, shards):
            _run(*shard, case, case.seq_len(n), None)
    return results


# --------------------------------------------------------------------------- the check


def check(function, **options) -> CheckResult:
    report = CheckResult("ring_attention_merge")
    for n in WORLD_SIZES:
        run, failure = launch_checked(_worker, n, (function,), "merge_block",
                                      transport=TRANSPORT, events=True)
        if failure is not None:
            report.failure = failure
            return report
        results, events = run
        for index in range(len(CASES)):
            failure, step = _check_merges(n, index, [result[index][1] for result in results])
            if failure is None:
                failure, step = _check_attention(n, index, [result[index][0]
                                                            for result in results]), 0
            if failure is not None:
                report.failure = failure
                report.replay = _replay(n, events, index, step, failure)
                return report
    report.passed.append(
        f"real processes ({TRANSPORT}, float64), {' and '.join(map(str, WORLD_SIZES))} ranks, "
        f"{len(CASES)} cases ({', '.join(case.name for case in CASES)}): every merge of the ring "
        "equals the reference merge of the same inputs")
    report.passed.append("every rank's output, and the gradients of q, k and v (the backward "
                         "reads the LSE your merges left), equal full attention's")
    return report


def _same(got, want) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL,
                                                        equal_nan=False))


def _check_merges(n, index, calls_per_rank):
    """The first wrong merge (lowest step, then rank): (Failure, step) or (None, None)."""
    case = CASES[index]
    seq_len = case.seq_len(n)
    first = None
    for rank, calls in enumerate(calls_per_rank):
        plan = schedule(seq_len, n, rank, case.causal)
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


def _row_weights(out, block_out, got):
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


def _like(values, want) -> bool:
    """``values`` (nan where unknown) equal ``want`` wherever known."""
    known = ~np.isnan(values)
    want = np.broadcast_to(want, values.shape)
    return not known.any() or bool(np.allclose(values[known], want[known], rtol=1e-6,
                                                  atol=1e-9))


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
    fresh = np.isneginf(lse)
    right_old = np.exp(np.where(fresh, -np.inf, lse - want_lse)).reshape(-1)
    right_new = np.exp(block_lse - want_lse).reshape(-1)
    if not _same(got_out, want_out):
        a, b, fits = _row_weights(out, block_out, got_out)
        if fits and _like(a, 0.5) and _like(b, 0.5):
            return "averaged", (
                "your output is the average of the old output and the block's (weight 1/2 "
                "each): averaging outputs instead of weighting them by exp(lse). Each state's "
                "weight is its share of the new denominator, exp(lse - lse') for the old and "
                "exp(block_lse - lse') for the block's: a block whose keys score higher counts "
                "more, and an empty state (lse = -inf) counts nothing")
        if fits and _like(a, 1.0) and _like(b, right_new):
            return "old not rescaled", (
                "the old output keeps weight 1 while the block's comes in at exp(block_lse - "
                "lse'): the old output is not rescaled by exp(lse - lse'), so a row's weights "
                "sum to more than 1 and the blocks merged first count too much. The new "
                "denominator holds both sets of keys: rescale the old output by its share of it")
        if fits and _like(a, right_old) and _like(b, 1.0):
            return "weighted to the last block", (
                "outputs weighted toward the last block: the block's output comes in at weight "
                "1 (the old at exp(lse - lse')), so a row's weights sum to more than 1. Rescale "
                "the block's output too, by exp(block_lse - lse'), its share of the new "
                "denominator")
        if fits and _like(a, 1.0) and _like(b, 1.0):
            return "not rescaled", (
                "your output is the sum of the old output and the block's, each at weight 1: "
                "neither is rescaled. Weight the old by exp(lse - lse') and the block's by "
                "exp(block_lse - lse'), their shares of the new denominator (they sum to 1)")
        if fits and _like(a, 0.0) and _like(b, 1.0):
            return "replaced", (
                "your output is the block's alone: the old output is dropped, so the result "
                "is the attention over the last block's keys only. Keep the old at weight "
                "exp(lse - lse')")
        if fits and _like(a, right_new) and _like(b, right_old):
            return "swapped weights", (
                "the weights are swapped: the old output has the block's weight exp(block_lse - "
                "lse') and the block's the old's exp(lse - lse')")
        index = np.unravel_index(int(np.flatnonzero(~np.isclose(got_out, want_out, rtol=RTOL,
                                                                atol=ATOL))[0]), want_out.shape)
        return "wrong result", (
            f"the merged output at {tuple(int(i) for i in index)} is {got_out[index]:.6g}, "
            f"expected {want_out[index]:.6g} (exp(lse - lse') O + exp(block_lse - lse') O_b)")
    if _same(got_lse, np.maximum(lse, block_lse)):
        reason = ("it is the larger of the two, not their log-sum-exp: the denominators add, "
                  "lse' = log(exp(lse) + exp(block_lse)) (np.logaddexp)")
    elif _same(got_lse, block_lse):
        reason = "it is the block's alone: the new denominator holds the old keys too"
    elif _same(got_lse, lse):
        reason = "it is the old one, unchanged: the block's keys add to the denominator"
    elif _same(got_lse, lse + block_lse):
        reason = ("it is the sum of the two logs, which multiplies the denominators; they add: "
                  "lse' = log(exp(lse) + exp(block_lse))")
    else:
        index = np.unravel_index(int(np.flatnonzero(~np.isclose(got_lse, want_lse, rtol=RTOL,
                                                                atol=ATOL))[0]), want_lse.shape)
        reason = (f"at {tuple(int(i) for i in index)} it is {got_lse[index]:.6g}, expected "
                  f"{want_lse[index]:.6g}")
    return "wrong lse", (
        f"the output is right but the new lse is not: {reason}. The next merges weigh the "
        "states by it, and the backward recomputes every probability from it")


def _check_attention(n, index, results):
    """Every rank's output and q, k, v gradients against full attention."""
    case = CASES[index]
    seq_len = case.seq_len(n)
    q, k, v, grad = _problem(index, n)
    tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    whole = F.scaled_dot_product_attention(*tensors, is_causal=case.causal)
    whole.backward(grad)
    wanted = [whole.data] + [t.grad for t in tensors]
    names = ("output", "gradient of q", "gradient of k", "gradient of v")
    for rank, got in enumerate(results):
        for name, mine, want in zip(names, got, wanted):
            want = shard_sequence(np.asarray(want), seq_len, n, rank, axis=2)
            mine = np.asarray(mine)
            if not _same(mine, want):
                where = np.unravel_index(int(np.flatnonzero(
                    ~np.isclose(mine, want, rtol=RTOL, atol=ATOL))[0]), want.shape)
                return Failure("wrong result", (
                    f"on {n} ranks ({case.words(n)}): every merge is right, but rank {rank}'s "
                    f"{name} at {tuple(int(i) for i in where)} is {mine[where]:.6g}, full "
                    f"attention's {want[where]:.6g}"), rank=rank)
    return None


def _replay(n, events, index, step, failure):
    """The forward ring of case ``index``, the student's run beside the
    reference's (their trace events; :mod:`viz.exercise_replay` draws them
    with :mod:`viz.ring_attention_replay`), the step of the first wrong merge
    marked (step 0: each rank's own block, before any message)."""
    def info(event):
        return trace.label_info(event.get("label") or "")

    calls = sorted({info(e).get("ring_attention") for e in events if e["kind"] == "send"}
                   - {None})
    if len(calls) != 2 * len(CASES):
        return None

    def forward(call):
        return [e for e in events if info(e).get("ring_attention") == call
                and info(e).get("phase") == "forward"]

    student = forward(calls[index])
    block = next((e["bytes"] for e in student if e["kind"] == "send"), 0)
    return {"world_size": n, "count": int(block) // 8, "student": student,
            "reference": forward(calls[len(CASES) + index]), "first_difference": step,
            "difference": (f"rank {failure.rank}, ring step {step}: the first wrong merge "
                           f"({failure.kind}); the messages are the reference's, the values "
                           "merged are not")}


EXERCISE = Exercise(
    name="ring_attention_merge", function="merge_block",
    summary="ring attention's online-softmax merge of a block into the running (out, lse)",
    lesson="lessons/18_long_sequences.py", reference=merge_block, check=check)
