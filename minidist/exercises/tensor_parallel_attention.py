"""Exercise: the two all_reduces of an attention split by heads (lesson 17).

Megatron splits a transformer's attention by heads
(:mod:`minidist.parallel.tensor.gpt`): on n ranks, rank r keeps
n_head / n heads, that is the rows of the fused ``c_attn`` that make their
q, k and v (a column split, :func:`~minidist.parallel.tensor.gpt.qkv_rows`)
and the columns of ``c_proj`` that read their outputs (a row split). The
heads are independent until ``c_proj`` mixes them, so nothing is sent
between the two layers. The communication sits at two points, the
conjugate operators f and g of Megatron's paper (Shoeybi et al., 2019, §3)::

    x --f--> c_attn shard --> my heads' attention --> c_proj shard --g--> + bias --> y

* f, before ``c_attn`` (``copy_to_parallel_region``): forward, the identity
  (every rank holds the whole x); backward, an all_reduce (each rank's heads
  give one part of x's gradient, and x's gradient is their sum);
* g, after ``c_proj`` (``reduce_from_parallel_region``): forward, an
  all_reduce (c_proj's product over my heads' columns is one term of y);
  backward, the identity (y's gradient is whole on every rank).

The student writes the function the shard calls at the four points (f
and g, forward and backward: :class:`~.attention_shard.AttentionShard`).
Checked on real processes (2 and 4 ranks, float64:
:func:`~.process_check.check_beside_reference`) against the unsplit
:class:`~minidist.models.gpt.CausalSelfAttention`: every rank's output and
input gradient and its shards' weight gradients equal the whole block's to
float rounding; then, from the run's trace, the collectives at each point:
one all_reduce of B T C values in each pass, no more. A wrong answer is
told by what it looks like (a partial sum, an average, a factor of n) and
by where the trace found the student's collectives; the student's misplaced
call is replayed beside the reference's.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.exercises.attention_shard import AttentionShard
from minidist.exercises.exercise import Exercise, Failure
from minidist.exercises.process_check import (
    check_beside_reference,
    first_wrong,
    forward_backward,
    replay_of_calls,
    same,
    traced_calls,
)
from minidist.models.gpt import CausalSelfAttention, GPTConfig

#: the block: B sequences of T positions, width C, H heads (H divisible by every n)
BATCH, STEPS, WIDTH, HEADS = 2, 5, 8, 4
SEED = 17

#: what a check that passes has held
PASSED = (": every rank's output, input gradient and weight-shard gradients equal the unsplit "
          "CausalSelfAttention's",
          "from the trace: one all_reduce of B T C values in the forward (g's) and one in the "
          "backward (f's), nothing else")

#: the four points, in the order a step reaches them
POINTS = ("f forward", "g forward", "g backward", "f backward")
#: where Megatron's all_reduces are: one each pass
ALL_REDUCE_AT = ("g forward", "f backward")
WHERE = {
    "f forward": "f's forward (on x, before c_attn)",
    "g forward": "g's forward (on c_proj's partial output)",
    "g backward": "g's backward (on y's gradient)",
    "f backward": "f's backward (on x's gradient)",
}
#: why an all_reduce at the wrong point is wrong
WRONG_POINT = {
    "f forward": "f's forward sums x, which every rank already holds whole: the heads see "
                 "n x instead of x",
    "g backward": "g's backward sums y's gradient, which every rank already holds whole: it "
                  "becomes n times too big, and every gradient below it with it",
}


def attention_communication(array, operator, direction):
    """The reference: an all_reduce (sum) in g's forward and f's backward,
    nothing at the other two points. Cost per rank and pass: one ring
    all_reduce of B T C values, 2 (n - 1) / n B T C s bytes sent."""
    if (operator, direction) in (("g", "forward"), ("f", "backward")):
        dist.all_reduce(array)  # each rank's heads hold one term of the sum
    return array


# --------------------------------------------------------------------------- the case


def _problem():
    """The whole block (float64, random biases), its input and y's gradient."""
    config = GPTConfig(vocab_size=1, block_size=STEPS, n_layer=1, n_head=HEADS, n_embd=WIDTH)
    generator = np.random.default_rng(SEED)
    attention = CausalSelfAttention(config, rng=generator, dtype=np.float64)
    for layer in (attention.c_attn, attention.c_proj):
        layer.bias.data[...] = generator.standard_normal(layer.bias.data.shape)
    x = generator.standard_normal((BATCH, STEPS, WIDTH))
    return attention, x, generator.standard_normal((BATCH, STEPS, WIDTH))


def _run_shard(communicate, case):
    """(y, (x's gradient,), {name: its shard's gradient}) of this rank's shard."""
    attention, x, grad_out = _problem()
    shard = AttentionShard(attention, dist.get_rank(), dist.get_world_size(), communicate)
    return forward_backward(shard, (x,), grad_out, shard.parameters)


# --------------------------------------------------------------------------- the check


def check(function, **options):
    return check_beside_reference("tensor_parallel_attention", _run_shard, function,
                                  attention_communication, "attention_communication", _judge,
                                  PASSED)


def _judge(n, case, results, events):
    mine = traced_calls(events, "yours", points=POINTS)
    failure, wrong_pass = _compare(n, results, mine)
    if failure is None:
        failure, wrong_pass = _traffic(n, mine)
    if failure is None:
        return None
    reference = traced_calls(events, "reference", points=POINTS)
    return failure, _replay(n, events, mine, reference, wrong_pass)


def _direction(call) -> str:
    return (call.point or "forward").split()[-1]


def _words(call) -> str:
    where = WHERE[call.point] if call.point else "outside f and g"
    return f"{call.collective} of {call.count} values in {where}"


def _placement(calls) -> str:
    """What the trace saw, both passes."""
    found = {direction: [call for call in calls if _direction(call) == direction]
             for direction in ("forward", "backward")}
    seen = [f"in the {direction}: " + ", ".join(map(_words, these)) if these
            else f"no collective in the {direction}" for direction, these in found.items()]
    return f"The trace of your run: {seen[0]}; {seen[1]}."


def _misplaced(calls, direction) -> list[str]:
    """Why the student's collectives at the wrong points of ``direction`` are
    wrong, and how many times the bytes of the pass's one all_reduce they make."""
    found = [call for call in calls if _direction(call) == direction]
    reasons = [WRONG_POINT.get(call.point, f"{_words(call)} does not belong there")
               for call in found if call.point not in ALL_REDUCE_AT]
    if reasons and len(found) > 1:
        sent = sum(call.count * call.itemsize for call in found)
        reasons.append(f"the {direction} sends {sent / (8 * BATCH * STEPS * WIDTH):.1f} x the "
                       "bytes of the one all_reduce of B T C values it needs")
    return reasons


def _compare(n, results, calls):
    """The first wrong value, told by what it looks like; (Failure, pass) or (None, None)."""
    attention, x, grad_out = _problem()
    whole = forward_backward(attention, (x,), grad_out, dict(attention.named_parameters()))
    for rank, (y, (dx,), grads) in enumerate(results):
        shard = AttentionShard(attention, rank, n, lambda array, *_: array)
        # no message: its own terms only
        alone = forward_backward(shard, (x,), grad_out, shard.parameters)
        bias = attention.c_proj.bias.data
        failure = _check_output(n, rank, np.asarray(y), whole[0], alone[0], bias, calls)
        if failure is not None:
            return failure, "forward"
        wanted = [("gradient of x", np.asarray(dx), whole[1][0], alone[1][0])]
        wanted += [(f"gradient of {name} (its shard)", np.asarray(grads.get(name)),
                    whole[2][name][shard.pieces[name]], alone[2][name])
                   for name in shard.parameters]
        for what, got, want, partial in wanted:
            failure = _check_gradient(n, rank, what, got, want, partial, calls)
            if failure is not None:
                return failure, "backward"
    return None, None


def _where(n, what, rank, got, want) -> str:
    if got.shape != want.shape:
        return f"on {n} ranks: rank {rank}'s {what} has shape {got.shape}, expected {want.shape}"
    index = first_wrong(got, want)
    return (f"on {n} ranks: rank {rank}'s {what} at {index} is {got[index]:.6g}, "
            f"expected {want[index]:.6g}")


def _check_output(n, rank, y, want, alone, bias, calls):
    if same(y, want):
        return None
    where, trail = _where(n, "output y", rank, y, want), " " + _placement(calls)
    if same(y, alone):
        return Failure("partial sums", (
            f"{where}: it is this rank's partial sum, c_proj's product over its own "
            f"{WIDTH // n} columns ({HEADS // n} of the {HEADS} heads) plus the bias, not the "
            "block's output: the other ranks' heads are missing. Sum the partial outputs over "
            "the ranks: an all_reduce in g's forward, after c_proj, before the bias." + trail),
            rank=rank)
    if y.shape == want.shape and same(y - bias, (want - bias) / n):
        return Failure("averaged", (
            f"{where}: y minus the bias is 1/n = 1/{n} of the right sum, an average. The "
            "partial outputs are not n estimates of one value but n different terms of it "
            "(each rank's heads): sum them (all_reduce's SUM), divide by nothing." + trail),
            rank=rank)
    if y.shape == want.shape and same(y - bias, n * (want - bias)):
        return Failure("wrong result", (
            f"{where}: y minus the bias is n = {n} times the right sum: summed twice?" + trail),
            rank=rank)
    return _told_by_placement(where, trail, "", calls, "forward", "g's forward", rank)


def _check_gradient(n, rank, what, got, want, partial, calls):
    if same(got, want):
        return None
    where, trail = _where(n, what, rank, got, want), " " + _placement(calls)
    if same(got, partial) and what == "gradient of x":
        return Failure("partial gradient", (
            f"{where}: it is this rank's part only, the gradient through its own "
            f"{HEADS // n} heads. x fed every rank's heads (f copied it to them), so its "
            "gradient is the sum of every rank's part: an all_reduce in f's backward." + trail),
            rank=rank)
    if got.shape == want.shape and same(got, want / n):
        return Failure("averaged", (
            f"{where}: 1/n = 1/{n} of it, an average. Each rank's part is a different term "
            "of the gradient, not an estimate of it: sum the parts, divide by nothing."
            + trail), rank=rank)
    factor = (f" It is off by a factor of n = {n}."
              if got.shape == want.shape and same(got, n * want) else "")
    return _told_by_placement(where, trail, factor, calls, "backward", "f's backward", rank)


def _told_by_placement(where, trail, factor, calls, direction, belongs, rank):
    """A wrong value no shape explains: by the collectives at wrong points, if any."""
    reasons = _misplaced(calls, direction)
    if reasons:
        return Failure("misplaced", (
            f"{where}.{factor} " + "; ".join(reasons) + f". The {direction}'s one all_reduce "
            f"belongs in {belongs}." + trail), rank=rank)
    return Failure("wrong result", where + "." + factor + trail, rank=rank)


def _traffic(n, calls):
    """Right values: then exactly one all_reduce of B T C values each pass;
    (Failure, the pass) or (None, None)."""
    values = BATCH * STEPS * WIDTH
    for direction in ("forward", "backward"):
        found = [call for call in calls if _direction(call) == direction]
        extra = [call for call in found if call.point not in ALL_REDUCE_AT
                 or call.collective != "all_reduce" or call.count != values]
        if len(found) != 1 or extra:
            sent = sum(call.count * call.itemsize for call in found)
            return Failure("wasteful", (
                f"correct, but on {n} ranks the {direction} makes {len(found)} collective "
                f"calls ({', '.join(map(_words, found))}) of {sent} bytes, "
                f"{sent / (8 * values):.1f} x the {8 * values} of the one all_reduce of B T C "
                f"= {values} values it needs, in "
                f"{WHERE[ALL_REDUCE_AT[direction == 'backward']]}. " + _placement(calls))), direction
    return None, None


def _replay(n, events, mine, reference, wrong_pass):
    """The side-by-side replay of the student's first collective call that
    is not where the reference's is (or, all in place, of the call of the
    pass that went wrong) beside the reference's; None when the student
    made no call there."""
    shorter = min(len(mine), len(reference))
    index = next((k for k, (a, b) in enumerate(zip(mine, reference)) if a.point != b.point),
                 None)
    if index is None:
        index = shorter if len(mine) != len(reference) else next(
            (k for k, call in enumerate(reference) if _direction(call) == wrong_pass), 0)
    if index >= shorter:
        return None
    yours, theirs = mine[index], reference[index]
    if yours.point == theirs.point:
        return replay_of_calls(n, events, yours, theirs, None, (
            f"your call {index + 1}, {_words(yours)}, is where the reference's is, with the "
            "same messages: what differs is the values (what you sum, or what you do with "
            "the sum)"))
    # a call in the wrong place differs from its first message on: step 1
    return replay_of_calls(n, events, yours, theirs, 1, (
        f"your collective call {index + 1}: {_words(yours)}; the reference's: {_words(theirs)}"))


EXERCISE = Exercise(
    name="tensor_parallel_attention", function="attention_communication",
    summary="attention split by heads: where its forward and backward all_reduce go (f and g)",
    lesson="lessons/17_splitting_a_transformer.py", reference=attention_communication,
    check=check)
