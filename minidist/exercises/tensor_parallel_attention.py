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

The student writes the function the shard calls at the four points (f and
g, forward and backward); the shard (:class:`AttentionShard`) is built for
them. The checker runs it on real processes (2 and 4 ranks, shared memory,
float64, one launch per world size; the student's run and then the
reference's in it) against the unsplit
:class:`~minidist.models.gpt.CausalSelfAttention`: every rank's output and
input gradient and its shards' weight gradients equal the whole block's to
float rounding; then, from the run's trace, the collectives at each point:
one all_reduce of B T C values in each pass, no more. A wrong answer is
told by what it looks like (a partial sum, an average, a factor of n) and
by where the trace found the student's collectives; the student's misplaced
call is replayed beside the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked
from minidist.models.gpt import CausalSelfAttention, GPTConfig
from minidist.nn import functional as F
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor.gpt import qkv_rows
from minidist.tensor import Tensor

WORLD_SIZES = (2, 4)
TRANSPORT = "shm"
#: the block: B sequences of T positions, width C, H heads (H divisible by every n)
BATCH, STEPS, WIDTH, HEADS = 2, 5, 8, 4
SEED = 17

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


# --------------------------------------------------------------------------- the shard


def _call(communicate, array, operator: str, direction: str):
    """The student's function at one point, in a trace region named after
    it (the checker finds each collective's point by it). It gets its own
    contiguous copy, to change in place or not."""
    given = np.array(array, dtype=np.float64, copy=True, order="C")
    with trace.region(f"{operator} {direction}"):
        out = communicate(given, operator, direction)
    if not isinstance(out, np.ndarray) or out.shape != given.shape:
        got = (f"an array of shape {out.shape}" if isinstance(out, np.ndarray)
               else type(out).__name__)
        raise TypeError(f"attention_communication(array, {operator!r}, {direction!r}) "
                        f"returned {got}, expected an array of shape {given.shape}: return "
                        "the array to pass on (the one you were given, changed in place, "
                        "or a new one)")
    return np.asarray(out, dtype=np.float64)


def _point(tensor: Tensor, operator: str, communicate) -> Tensor:
    """An autograd node that calls ``communicate`` on the values going
    forward and on the gradient coming back: Megatron's f or g, written by
    the student."""
    out = _call(communicate, tensor.data, operator, "forward")
    return Tensor._make(out, (tensor,),
                        lambda grad: (_call(communicate, grad, operator, "backward"),),
                        f"{operator} (tensor-parallel)")


class AttentionShard:
    """Rank ``rank``'s n_head / n heads of ``attention`` (a whole
    :class:`~minidist.models.gpt.CausalSelfAttention`), with the student's
    ``communicate`` at f and g. The forward is the block's own with two
    changes: c_attn's and c_proj's weights are this rank's shards, and
    c_proj's bias is added after g (once, to the sum, not by every rank to
    its term)."""

    def __init__(self, attention: CausalSelfAttention, rank: int, world_size: int,
                 communicate):
        width = attention.n_embd
        rows = qkv_rows(width, attention.n_head, rank, world_size)
        columns = slice(rank * width // world_size, (rank + 1) * width // world_size)
        self.heads, self.head_dim = attention.n_head // world_size, attention.head_dim
        self.communicate = communicate
        self.parameters = {
            "c_attn.weight": Parameter(attention.c_attn.weight.data[rows].copy()),
            "c_attn.bias": Parameter(attention.c_attn.bias.data[rows].copy()),
            "c_proj.weight": Parameter(attention.c_proj.weight.data[:, columns].copy()),
            "c_proj.bias": Parameter(attention.c_proj.bias.data.copy()),  # replicated
        }
        #: which part of the whole parameter each shard is
        self.pieces = {"c_attn.weight": rows, "c_attn.bias": rows,
                       "c_proj.weight": (slice(None), columns), "c_proj.bias": slice(None)}

    def __call__(self, x: Tensor) -> Tensor:
        p = self.parameters
        x = _point(x, "f", self.communicate)
        qkv = F.linear(x, p["c_attn.weight"], p["c_attn.bias"])  # my heads' q, k, v
        batch, steps, _ = qkv.shape
        qkv = qkv.reshape(batch, steps, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(batch, steps, self.heads * self.head_dim)
        partial = F.linear(y, p["c_proj.weight"])  # one term of c_proj's product
        return _point(partial, "g", self.communicate) + p["c_proj.bias"]


def _problem():
    """The whole block (float64, random biases), its input and y's gradient."""
    config = GPTConfig(vocab_size=1, block_size=STEPS, n_layer=1, n_head=HEADS, n_embd=WIDTH)
    generator = np.random.default_rng(SEED)
    attention = CausalSelfAttention(config, rng=generator, dtype=np.float64)
    for layer in (attention.c_attn, attention.c_proj):
        layer.bias.data[...] = generator.standard_normal(layer.bias.data.shape)
    x = generator.standard_normal((BATCH, STEPS, WIDTH))
    return attention, x, generator.standard_normal((BATCH, STEPS, WIDTH))


def _run(forward, x, grad_out, parameters):
    """(y, x's gradient, {name: gradient}) of one forward and backward."""
    x = Tensor(x, requires_grad=True)
    with trace.region("forward"):
        y = forward(x)
    with trace.region("backward"):
        y.backward(grad_out)
    return (np.array(y.data), np.array(x.grad),
            {name: np.array(p.grad) for name, p in parameters.items()})


def _run_shard(communicate, rank, n):
    attention, x, grad_out = _problem()
    shard = AttentionShard(attention, rank, n, communicate)
    return _run(shard, x, grad_out, shard.parameters)


def _worker(function):
    rank, n = dist.get_rank(), dist.get_world_size()
    with trace.region("yours"):
        mine = _run_shard(function, rank, n)
    with trace.region("reference"):   # the same launch: its trace, for the replay
        _run_shard(attention_communication, rank, n)
    return mine


# --------------------------------------------------------------------------- the check


def check(function, **options) -> CheckResult:
    report = CheckResult("tensor_parallel_attention")
    for n in WORLD_SIZES:
        run, failure = launch_checked(_worker, n, (function,), "attention_communication",
                                      transport=TRANSPORT, events=True)
        if failure is not None:
            report.failure = failure
            return report
        results, events = run
        mine, reference = _calls(events, "yours"), _calls(events, "reference")
        failure, wrong_pass = _compare(n, results, mine)
        if failure is None:
            failure, wrong_pass = _traffic(n, mine)
        if failure is not None:
            report.failure = failure
            report.replay = _replay(n, events, mine, reference, wrong_pass)
            return report
    report.passed.append(
        f"real processes ({TRANSPORT}, float64), {' and '.join(map(str, WORLD_SIZES))} ranks: "
        "every rank's output, input gradient and weight-shard gradients equal the unsplit "
        "CausalSelfAttention's")
    report.passed.append("from the trace: one all_reduce of B T C values in the forward "
                         "(g's) and one in the backward (f's), nothing else")
    return report


@dataclass(frozen=True)
class _Call:
    """One collective call of rank 0, and the point it was made at."""

    point: str | None   # "g forward", ...; None: outside the four points
    collective: str
    count: int
    itemsize: int
    call: int           # the call's number in the trace (its messages carry it)

    @property
    def direction(self) -> str:
        return (self.point or "forward").split()[-1]

    def words(self) -> str:
        where = WHERE[self.point] if self.point else "outside f and g"
        return f"{self.collective} of {self.count} values in {where}"


def _inside(event, region) -> bool:
    return region["start"] <= event["start"] and event["end"] <= region["end"]


def _calls(events, run: str) -> list[_Call]:
    """Rank 0's collective calls in ``run`` ("yours" or "reference"), in the
    order made, each with the point whose trace region holds it."""
    own = sorted((e for e in events if e["rank"] == 0), key=lambda e: e["start"])
    outer = next(e for e in own if e["kind"] == "compute" and e["label"] == run)
    points = [e for e in own if e["kind"] == "compute" and e["label"] in POINTS
              and _inside(e, outer)]
    calls = []
    for event in own:
        if event["kind"] == "collective" and _inside(event, outer):
            info = trace.label_info(event["label"])
            point = next((p["label"] for p in points if _inside(event, p)), None)
            calls.append(_Call(point, str(info.get("collective", "?")), int(info.get("count", 0)),
                               int(info.get("itemsize", 8)), int(info.get("call", -1))))
    return calls


def _describe(calls, direction) -> str:
    found = [call for call in calls if call.direction == direction]
    if not found:
        return f"no collective in the {direction}"
    return f"in the {direction}: " + ", ".join(call.words() for call in found)


def _placement(calls) -> str:
    """What the trace saw, both passes."""
    return (f"The trace of your run: {_describe(calls, 'forward')}; "
            f"{_describe(calls, 'backward')}.")


def _misplaced(calls, direction) -> list[str]:
    """Why the student's collectives at the wrong points of ``direction`` are
    wrong, and how many times the bytes of the pass's one all_reduce they make."""
    found = [call for call in calls if call.direction == direction]
    reasons = [WRONG_POINT.get(call.point, f"{call.words()} does not belong there")
               for call in found if call.point not in ALL_REDUCE_AT]
    if reasons and len(found) > 1:
        sent = sum(call.count * call.itemsize for call in found)
        reasons.append(f"the {direction} sends {sent / (8 * BATCH * STEPS * WIDTH):.1f} x the "
                       "bytes of the one all_reduce of B T C values it needs")
    return reasons


def _same(got, want) -> bool:
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-12)


def _compare(n, results, calls):
    """The first wrong value, told by what it looks like; (Failure, pass) or (None, None)."""
    attention, x, grad_out = _problem()
    whole = _run(attention, x, grad_out,
                 {name: parameter for name, parameter in attention.named_parameters()})
    for rank, (y, dx, grads) in enumerate(results):
        shard = AttentionShard(attention, rank, n, lambda array, *_: array)
        alone = _run(shard, x, grad_out, shard.parameters)  # no message: its own terms only
        bias = attention.c_proj.bias.data
        failure = _check_output(n, rank, np.asarray(y), whole[0], alone[0], bias, calls)
        if failure is not None:
            return failure, "forward"
        wanted = [("gradient of x", np.asarray(dx), whole[1], alone[1])]
        wanted += [(f"gradient of {name} (its shard)", np.asarray(grads.get(name)),
                    whole[2][name][shard.pieces[name]], alone[2][name])
                   for name in shard.parameters]
        for what, got, want, partial in wanted:
            failure = _check_gradient(n, rank, what, got, want, partial, calls)
            if failure is not None:
                return failure, "backward"
    return None, None


def _element(what, rank, got, want) -> str:
    if got.shape != want.shape:
        return f"rank {rank}'s {what} has shape {got.shape}, expected {want.shape}"
    index = np.unravel_index(int(np.flatnonzero(~np.isclose(got, want, rtol=1e-9,
                                                            atol=1e-12))[0]), want.shape)
    return (f"rank {rank}'s {what} at {tuple(int(i) for i in index)} is {got[index]:.6g}, "
            f"expected {want[index]:.6g}")


def _check_output(n, rank, y, want, alone, bias, calls):
    if _same(y, want):
        return None
    where = f"on {n} ranks: {_element('output y', rank, y, want)}"
    trail = " " + _placement(calls)
    if _same(y, alone):
        return Failure("partial sums", (
            f"{where}: it is this rank's partial sum, c_proj's product over its own "
            f"{WIDTH // n} columns ({HEADS // n} of the {HEADS} heads) plus the bias, not the "
            "block's output: the other ranks' heads are missing. Sum the partial outputs over "
            "the ranks: an all_reduce in g's forward, after c_proj, before the bias." + trail),
            rank=rank)
    if y.shape == want.shape and _same(y - bias, (want - bias) / n):
        return Failure("averaged", (
            f"{where}: y minus the bias is 1/n = 1/{n} of the right sum, an average. The "
            "partial outputs are not n estimates of one value but n different terms of it "
            "(each rank's heads): sum them (all_reduce's SUM), divide by nothing." + trail),
            rank=rank)
    if y.shape == want.shape and _same(y - bias, n * (want - bias)):
        return Failure("wrong result", (
            f"{where}: y minus the bias is n = {n} times the right sum: summed twice?" + trail),
            rank=rank)
    reasons = _misplaced(calls, "forward")
    if reasons:
        return Failure("misplaced", (
            f"{where}. " + "; ".join(reasons) + ". The forward's one all_reduce belongs in "
            "g's forward." + trail), rank=rank)
    return Failure("wrong result", where + "." + trail, rank=rank)


def _check_gradient(n, rank, what, got, want, partial, calls):
    if got.shape == want.shape and _same(got, want):
        return None
    where = f"on {n} ranks: {_element(what, rank, got, want)}"
    trail = " " + _placement(calls)
    if _same(got, partial) and what == "gradient of x":
        return Failure("partial gradient", (
            f"{where}: it is this rank's part only, the gradient through its own "
            f"{HEADS // n} heads. x fed every rank's heads (f copied it to them), so its "
            "gradient is the sum of every rank's part: an all_reduce in f's backward." + trail),
            rank=rank)
    if got.shape == want.shape and _same(got, want / n):
        return Failure("averaged", (
            f"{where}: 1/n = 1/{n} of it, an average. Each rank's part is a different term "
            "of the gradient, not an estimate of it: sum the parts, divide by nothing."
            + trail), rank=rank)
    factor = (f" It is off by a factor of n = {n}."
              if got.shape == want.shape and _same(got, n * want) else "")
    reasons = _misplaced(calls, "backward")
    if reasons:
        return Failure("misplaced", (
            f"{where}.{factor} " + "; ".join(reasons) + ". The backward's one all_reduce "
            "belongs in f's backward." + trail), rank=rank)
    return Failure("wrong result", where + "." + factor + trail, rank=rank)


def _traffic(n, calls):
    """Right values: then exactly one all_reduce of B T C values each pass;
    (Failure, the pass) or (None, None)."""
    values = BATCH * STEPS * WIDTH
    for direction in ("forward", "backward"):
        found = [call for call in calls if call.direction == direction]
        extra = [call for call in found if call.point not in ALL_REDUCE_AT
                 or call.collective != "all_reduce" or call.count != values]
        if len(found) != 1 or extra:
            sent = sum(call.count * call.itemsize for call in found)
            return Failure("wasteful", (
                f"correct, but on {n} ranks the {direction} makes {len(found)} collective "
                f"calls ({', '.join(call.words() for call in found)}) of {sent} bytes, "
                f"{sent / (8 * values):.1f} x the {8 * values} of the one all_reduce of B T C "
                f"= {values} values it needs, in "
                f"{WHERE[ALL_REDUCE_AT[direction == 'backward']]}. " + _placement(calls))), direction
    return None, None


def _call_events(events, call: int) -> list[dict]:
    """The trace events of one collective call of the world group."""
    return [e for e in events if e.get("group", 0) == 0 and e["kind"] != "compute"
            and trace.label_info(e.get("label") or "").get("call") == call]


def _replay(n, events, mine, reference, wrong_pass):
    """The side-by-side replay of the student's first collective call that
    is not where the reference's is (or, all in place, of the call of the
    pass that went wrong) beside the reference's; None when the student
    made no call there."""
    index = next((k for k, (a, b) in enumerate(zip(mine, reference)) if a.point != b.point),
                 None)
    if index is None:
        if len(mine) != len(reference):
            index = min(len(mine), len(reference))
        else:
            index = next((k for k, call in enumerate(reference)
                          if call.direction == wrong_pass), 0)
    if index >= len(mine) or index >= len(reference):
        return None
    yours, theirs = mine[index], reference[index]
    if yours.point == theirs.point:
        difference = (f"your call {index + 1}, {yours.words()}, is where the reference's is, "
                      "with the same messages: what differs is the values (what you sum, or "
                      "what you do with the sum)")
    else:
        difference = (f"your collective call {index + 1}: {yours.words()}; the "
                      f"reference's: {theirs.words()}")
    student = _call_events(events, yours.call)
    if not any(event["kind"] == "collective" for event in student):
        return None  # a call on a group of the student's own: not the world's numbering
    return {"world_size": n, "count": yours.count, "student": student,
            "reference": _call_events(events, theirs.call),
            # a call in the wrong place differs from its first message on: step 1
            "first_difference": None if yours.point == theirs.point else 1,
            "difference": difference}


EXERCISE = Exercise(
    name="tensor_parallel_attention", function="attention_communication",
    summary="attention split by heads: where its forward and backward all_reduce go (f and g)",
    lesson="lessons/17_splitting_a_transformer.py", reference=attention_communication,
    check=check)
