"""The exercises: every reference passes its own checker, and every
known-wrong solution (tests/exercises/wrong/) is caught with the message a
student should read; hangs and errors are told within seconds and leave no
process or shared-memory segment behind; a failing ring writes a replay
whose first differing step is marked (checked on the frame model)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import minidist.distributed as dist
from minidist.exercises import NAMES, get
from minidist.exercises.exercise import load_function

WRONG = Path(__file__).resolve().parent / "wrong"

#: exercise -> (file, the failure kind expected, words the message must hold)
KNOWN_WRONG = {
    "ring_allreduce": [
        ("ring_off_by_one", "wrong chunk", ["rank 0, step 1 (reduce-scatter): you send chunk 1",
                                            "rank 0, element 0"]),
        ("ring_wrong_peer", "wrong peer", ["rank 0, step 4 (allgather)", "to rank 3"]),
        ("ring_missing_step", "missing step", ["step 6", "finished after 5 steps"]),
        ("ring_deadlock", "deadlock", ["rank 0 (step 1) waits for rank 3 (recv 'step 0')",
                                       "rank 3 (step 1) waits for rank 2", "a cycle"]),
        ("ring_wasteful", "wasteful", ["correct, but it sends 4.0 x the bytes of the ring"]),
        ("ring_raises", "raised", ["IndexError", "ring_raises.py:7"]),
        ("ring_not_generator", "not a generator", ["not a generator"]),
    ],
    "tree_broadcast": [
        ("tree_off_by_one", "wrong peer", ["rank 1, step 1: you send the whole buffer to rank 0",
                                           "finished without sending it"]),
        ("tree_wrong_peer", "raised", ["cannot receive from itself"]),
        ("tree_missing_step", "missing message", ["rank 1, step 1: you do not send"]),
        ("tree_deadlock", "deadlock", ["rank 3 (step 1) waits for rank 0 (recv 'from my child?')",
                                       "a cycle"]),
        ("tree_wasteful", "wasteful", ["4.0 x the bytes of the binomial tree"]),
    ],
    "recursive_doubling_allreduce": [
        ("doubling_off_by_one", "wrong peer", ["rank 0, step 1: you send the whole buffer to "
                                               "rank 2"]),
        ("doubling_wrong_peer", "raised", ["cannot send to itself"]),
        ("doubling_missing_step", "missing step", ["On 3 ranks", "finished after 1 step;"]),
        ("doubling_deadlock", "deadlock", ["recv 'round 0'", "a cycle"]),
        ("doubling_wasteful", "wasteful", ["x the bytes of recursive doubling"]),
    ],
}


def _children() -> list[int]:
    """Processes whose parent is this one (the checker's workers, if left),
    but for the segment reaper, which lives as long as this interpreter."""
    from minidist.runtime.segment_reaper import reaper_pid

    me, found, reaper = os.getpid(), [], reaper_pid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z" and int(entry) != reaper:
                found.append(int(entry))
    return found


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"minidist_{os.getpid()}_")}


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_every_reference_passes_its_own_checker(name):
    exercise = get(name)
    result = exercise.check(exercise.reference)
    assert result.ok, result.failure
    assert result.passed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_the_skeleton_says_it_is_not_written(name):
    exercise = get(name)
    result = exercise.check(load_function(exercise.skeleton, exercise.function, name))
    assert result.failure.kind == "not written", result.failure
    assert "not written yet" in result.failure.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,file,kind,words",
                         [(name, *case) for name, cases in KNOWN_WRONG.items() for case in cases],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_known_wrong_collectives_are_caught(name, file, kind, words):
    exercise = get(name)
    result = exercise.check(load_function(WRONG / f"{file}.py", exercise.function, name),
                            processes=False)
    assert result.failure is not None, f"{file} passed the checker"
    assert result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message


@pytest.mark.timeout(60)
def test_a_hang_is_told_in_seconds_and_leaves_nothing_behind():
    exercise = get("ring_allreduce")
    before = _segments()
    started = time.monotonic()
    result = exercise.check(load_function(WRONG / "ring_endless.py", exercise.function,
                                          exercise.name))
    assert time.monotonic() - started < 10
    assert result.failure.kind == "hang"
    assert "did not finish in" in result.failure.message
    assert not _children() and _segments() == before


def _only_rank_0_reduces(x, weight_shard, bias_shard, split):
    partial = np.ascontiguousarray(x @ weight_shard.T)
    if dist.get_world_size() > 1 and dist.get_rank() == 0:
        dist.all_reduce(partial)  # the others never join: rank 0 waits
    return partial + bias_shard


def _bias_every_rank(x, weight_shard, bias_shard, split):
    if split == "column":
        return get("tensor_parallel_linear").reference(x, weight_shard, bias_shard, split)
    partial = np.ascontiguousarray(x @ weight_shard.T) + bias_shard
    dist.all_reduce(partial)
    return partial


def _own_slice_only(x, weight_shard, bias_shard, split):
    return x @ weight_shard.T + bias_shard


def _raises(x, weight_shard, bias_shard, split):
    raise ValueError("my shapes are wrong")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,words", [
    (_only_rank_0_reduces, "unmatched", ["on 2 processes",
                                          "returned from its function while rank 0"]),
    (_bias_every_rank, "wrong result", ["the bias is added n times"]),
    (_own_slice_only, "wrong shape", ["returned shape (1, 1), expected shape (1, 2)",
                                      "gather the slices"]),
    (_raises, "raised", ["my shapes are wrong"]),
])
def test_tensor_parallel_mistakes_on_real_processes(function, kind, words):
    before = _segments()
    started = time.monotonic()
    result = get("tensor_parallel_linear").check(function)
    assert time.monotonic() - started < 10
    assert result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


def _no_forward_all_reduce(array, operator, direction):
    if (operator, direction) == ("f", "backward"):
        dist.all_reduce(array)
    return array


def _all_reduce_everywhere(array, operator, direction):
    dist.all_reduce(array)  # both directions of both operators
    return array


def _no_backward_all_reduce(array, operator, direction):
    if (operator, direction) == ("g", "forward"):
        dist.all_reduce(array)
    return array


def _averages(array, operator, direction):
    if (operator, direction) in (("g", "forward"), ("f", "backward")):
        dist.all_reduce(array)
        array /= dist.get_world_size()
    return array


def _backward_in_g(array, operator, direction):
    if operator == "g":
        dist.all_reduce(array)
    return array


def _backward_twice(array, operator, direction):
    # Right values: g's backward sums y's gradient and divides it back.
    if (operator, direction) != ("f", "forward"):
        dist.all_reduce(array)
    if (operator, direction) == ("g", "backward"):
        array /= dist.get_world_size()
    return array


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,words", [
    (_no_forward_all_reduce, "partial sums", [
        "on 2 ranks: rank 0's output y", "this rank's partial sum", "an all_reduce in g's forward",
        "no collective in the forward"]),
    (_all_reduce_everywhere, "misplaced", [
        "f's forward sums x, which every rank already holds whole", "2.0 x the bytes",
        "in the backward: all_reduce of 80 values in g's backward"]),
    (_no_backward_all_reduce, "partial gradient", [
        "rank 0's gradient of x", "this rank's part only", "an all_reduce in f's backward",
        "no collective in the backward"]),
    (_averages, "averaged", ["1/n = 1/2 of the right sum", "divide by nothing"]),
    (_backward_in_g, "misplaced", ["g's backward sums y's gradient",
                                   "belongs in f's backward"]),
    (_backward_twice, "wasteful", ["correct, but on 2 ranks the backward makes 2 collective",
                                   "2.0 x the 640"]),
], ids=lambda value: value.__name__.strip("_") if callable(value) else "")
def test_tensor_parallel_attention_mistakes_on_real_processes(function, kind, words):
    before = _segments()
    result = get("tensor_parallel_attention").check(function)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


def test_a_misplaced_all_reduce_is_replayed_beside_the_reference():
    from viz.exercise_replay import side_by_side

    data = get("tensor_parallel_attention").check(_all_reduce_everywhere).replay
    assert data["difference"].startswith("your collective call 1: all_reduce of 80 values in "
                                         "f's forward")
    assert "the reference's: all_reduce of 80 values in g's forward" in data["difference"]
    model = side_by_side(data["student"], data["reference"], data["first_difference"],
                         data["difference"])
    assert model.marked == 1 and model.student.collective == "all_reduce"
    assert model.student.world_size == data["world_size"] == 2
    # a missing backward all_reduce has no call of the student's to show
    assert get("tensor_parallel_attention").check(_no_backward_all_reduce).replay is None


def _gpipe(stages, microbatches):
    return [[f"F{k}" for k in range(microbatches)] + [f"B{k}" for k in range(microbatches)]
            for _ in range(stages)]


def _backward_first_on_stage_0(stages, microbatches):
    # Stage 0 waits for B0's gradient before forwarding micro-batch 1, while
    # stage 1 forwards everything before any backward: nobody can go on.
    if stages == 1:
        return get("one_f_one_b").reference(stages, microbatches)
    orders = _gpipe(stages, microbatches)
    if stages > 1 and microbatches > 1:
        orders[0] = ["F0", "B0"] + [item for item in orders[0] if item not in ("F0", "B0")]
    return orders


def _forgets_a_backward(stages, microbatches):
    reference = get("one_f_one_b").reference(stages, microbatches)
    return [order[:-1] for order in reference]


def _backward_before_forward(stages, microbatches):
    return [[f"B{k}" for k in range(microbatches)] + [f"F{k}" for k in range(microbatches)]
            for _ in range(stages)]


def _one_list(stages, microbatches):
    return [f"F{k}" for k in range(microbatches)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,words", [
    (_gpipe, "memory", ["holds the activations of 2 micro-batches", "min(p - s, m) = 1"]),
    (_backward_first_on_stage_0, "deadlock", ["deadlocks on the pipeline simulator"]),
    (_forgets_a_backward, "invalid schedule", ["never does the backward of micro-batch 0"]),
    (_backward_before_forward, "invalid schedule", ["runs B0 before F0"]),
    (_one_list, "wrong shape", ["stage 0's order is a str", "expected a list like"]),
])
def test_schedule_mistakes_are_caught(function, kind, words):
    result = get("one_f_one_b").check(function)
    assert result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message


def test_a_wrong_schedule_comes_with_both_gantt_charts():
    result = get("one_f_one_b").check(_gpipe)
    assert set(result.schedules) == {"yours", "1F1B (reference)"}
    assert all(events for events in result.schedules.values())


# --------------------------------------------------------------------------- strategies


def _plain_average(weights, gradient, batch_size, lr):
    get("coordinator_data_parallel").reference(weights, gradient, 1, lr)


def _no_broadcast(weights, gradient, batch_size, lr):
    message = np.append(gradient * batch_size, batch_size)
    received = ([np.empty_like(message) for _ in range(dist.get_world_size())]
                if dist.get_rank() == 0 else None)
    dist.gather(message, received, dst=0)
    if dist.get_rank() == 0:
        weights -= lr * sum(m[:-1] for m in received) / sum(m[-1] for m in received)


def _one_call_per_gradient(gradients, bucket_bytes):
    for gradient in gradients:
        dist.all_reduce(gradient)
        gradient /= dist.get_world_size()


def _one_bucket(gradients, bucket_bytes):
    get("ddp_bucketing").reference(gradients, 1 << 30)


def _sum_not_average(gradients, bucket_bytes):
    reference = get("ddp_bucketing").reference
    reference(gradients, bucket_bytes)
    for gradient in gradients:
        gradient *= dist.get_world_size()


def _server_counts_itself(weights, gradient, lr):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total, incoming = gradient.copy(), np.empty_like(weights)
        for worker in range(1, n):
            dist.recv(incoming, src=worker, tag=1)
            total += incoming
        weights -= lr * total / n
        for worker in range(1, n):
            dist.send(weights, dst=worker, tag=2)
    else:
        dist.send(gradient, dst=0, tag=1)
        dist.recv(weights, src=0, tag=2)


def _workers_pull_first(weights, gradient, lr):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = np.empty_like(weights)
        for worker in range(1, n):
            dist.recv(incoming, src=worker, tag=1)
        for worker in range(1, n):
            dist.send(weights, dst=worker, tag=2)
    else:
        dist.recv(weights, src=0, tag=2)  # waits for a pull the server sends after the push
        dist.send(gradient, dst=0, tag=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,function,kind,words", [
    ("coordinator_data_parallel", _plain_average, "wrong result",
     ["plain average over ranks", "weight rank r's gradient by its batch_size"]),
    ("coordinator_data_parallel", _no_broadcast, "wrong result",
     ["rank 1", "only the coordinator updated? broadcast"]),
    ("ddp_bucketing", _one_call_per_gradient, "wasteful",
     ["5 all_reduce calls", "1.7 x the 3 of bucketing"]),
    ("ddp_bucketing", _one_bucket, "bucket too big", ["an all_reduce of 144 bytes"]),
    ("ddp_bucketing", _sum_not_average, "wrong result", ["that is the sum"]),
    ("parameter_server_round", _server_counts_itself, "wrong result",
     ["the server's own gradient was averaged in"]),
    ("parameter_server_round", _workers_pull_first, "deadlock",
     ["on 2 processes", "rank 0: waiting in recv from 1", "rank 1: waiting in recv from 0"]),
])
def test_strategy_mistakes_on_real_processes(name, function, kind, words):
    before = _segments()
    started = time.monotonic()
    result = get(name).check(function)
    assert time.monotonic() - started < 10
    assert result.failure is not None and result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


@pytest.mark.timeout(60)
def test_a_deadlocked_collective_on_real_processes_names_the_wait_for_chain():
    # The simulator catches it first (in milliseconds); this is the real-process
    # leg on its own: the runtime's report, within seconds, nothing left behind.
    from minidist.exercises import collective_check, ring_allreduce
    from minidist.exercises.exercise import CheckResult

    deadlocked = load_function(WRONG / "ring_deadlock.py", "ring_allreduce", "ring_allreduce")
    before = _segments()
    started = time.monotonic()
    failure = collective_check._check_processes(ring_allreduce.SPEC, deadlocked,
                                                CheckResult("ring_allreduce"))
    assert time.monotonic() - started < 10
    assert failure.kind == "deadlock", failure
    assert "rank 0: waiting in recv from 1" in failure.message
    assert "rank 1: waiting in recv from 0" in failure.message
    assert not _children() and _segments() == before


def _pushes_twice(weights, gradient, lr):
    # Right, but every worker pushes its gradient twice and the server reads both.
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total, incoming = np.zeros_like(weights), np.empty_like(weights)
        for worker in range(1, n):
            for _ in range(2):
                dist.recv(incoming, src=worker, tag=1)
            total += incoming
        weights -= lr * total / (n - 1)
        for worker in range(1, n):
            dist.send(weights, dst=worker, tag=2)
    else:
        dist.send(gradient, dst=0, tag=1)
        dist.send(gradient, dst=0, tag=1)
        dist.recv(weights, src=0, tag=2)


def _coordinator_by_all_gather(weights, gradient, batch_size, lr):
    # Right, but every rank gathers every gradient (no coordinator at all).
    n = dist.get_world_size()
    message = np.append(gradient * batch_size, batch_size)
    everyone = np.empty((n,) + message.shape)
    dist.all_gather_into_tensor(everyone, message)
    weights -= lr * everyone[:, :-1].sum(axis=0) / everyone[:, -1].sum()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,function,words", [
    ("parameter_server_round", _pushes_twice, ["on 5 ranks", "1.5 x the bytes", "push + pull"]),
    ("coordinator_data_parallel", _coordinator_by_all_gather, ["on 4 ranks", "2.2 x the coordinator"]),
])
def test_wasteful_strategies_are_told_from_the_trace(name, function, words):
    result = get(name).check(function)
    assert result.failure is not None and result.failure.kind == "wasteful", result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message


# --------------------------------------------------------------------------- the transformer exercises


def _old_not_rescaled(out, lse, block_out, block_lse):
    new = np.logaddexp(lse, block_lse)
    return out + np.exp(block_lse - new)[..., None] * block_out, new


def _block_at_weight_1(out, lse, block_out, block_lse):
    new = np.logaddexp(lse, block_lse)
    return np.exp(lse - new)[..., None] * out + block_out, new


def _exp_without_max(out, lse, block_out, block_lse):
    # Right for small scores; exp(lse) is inf past 709.
    total = np.exp(lse) + np.exp(block_lse)
    merged = np.exp(lse)[..., None] * out + np.exp(block_lse)[..., None] * block_out
    return merged / total[..., None], np.log(total)


def _averages_outputs(out, lse, block_out, block_lse):
    empty = np.isneginf(lse)[..., None]
    return np.where(empty, block_out, (out + block_out) / 2), np.logaddexp(lse, block_lse)


def _lse_is_max(out, lse, block_out, block_lse):
    merged, _ = get("ring_attention_merge").reference(out, lse, block_out, block_lse)
    return merged, np.maximum(lse, block_lse)


def _merges_in_place_returns_nothing(out, lse, block_out, block_lse):
    out[...], lse[...] = get("ring_attention_merge").reference(out, lse, block_out, block_lse)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,words", [
    (_old_not_rescaled, "old not rescaled", [
        "on 2 ranks (uneven blocks: T = 9, full): rank 0, ring step 0",
        "the old output is not rescaled by exp(lse - lse')", "the blocks merged first count"]),
    (_block_at_weight_1, "weighted to the last block", [
        "outputs weighted toward the last block", "by exp(block_lse - lse')"]),
    (_exp_without_max, "overflow", [
        "(large scores: T = 8, full)", "returned inf or nan", "overflows float64",
        "Subtract the larger of the two"]),
    (_averages_outputs, "averaged", ["averaging outputs instead of weighting them by exp(lse)"]),
    (_lse_is_max, "wrong lse", ["the output is right but the new lse is not",
                                "the larger of the two, not their log-sum-exp",
                                "the backward recomputes every probability"]),
    (_merges_in_place_returns_nothing, "raised", ["merge_block returned NoneType",
                                                  "expected a pair (out, lse)"]),
], ids=lambda value: value.__name__.strip("_") if callable(value) else "")
def test_ring_attention_merge_mistakes_on_real_processes(function, kind, words):
    before = _segments()
    result = get("ring_attention_merge").check(function)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


def test_a_wrong_merge_is_replayed_on_the_ring_at_its_step():
    from viz.exercise_replay import side_by_side

    # This average takes the block as it is into an empty state, so it first
    # goes wrong at a rank's second merge: rank 0's own second chunk, step 0.
    data = get("ring_attention_merge").check(_averages_outputs).replay
    assert data["world_size"] == 2 and data["first_difference"] == 0
    model = side_by_side(data["student"], data["reference"], data["first_difference"],
                         data["difference"])
    assert model.student.collective == "ring_attention"
    assert model.steps == data["world_size"] - 1 and model.marked == 0
    assert not any(pair.differs for pair in model.pairs)   # the messages are the reference's
    assert "rank 0, ring step 0: the first wrong merge (averaged)" in model.difference


def _moe_exchange(x, choices, kept, n_expert, experts, *, grouped=True, count_dropped=False,
                  combine=True, swapped=True, ungroup=True):
    """The reference's steps, each of which can be got wrong."""
    n = dist.get_world_size()
    local = n_expert // n
    token, which = np.nonzero(kept)
    expert = choices[token, which]
    order = np.argsort(expert, kind="stable") if grouped else np.arange(expert.size)
    counts = np.bincount(choices.reshape(-1) if count_dropped else expert,
                         minlength=n_expert).astype(np.int64)
    arriving = np.empty_like(counts)
    dist.all_to_all_single(arriving, counts)
    per_source = arriving.reshape(n, local)
    sent, received = counts.reshape(n, local).sum(1).tolist(), per_source.sum(1).tolist()
    rows = np.empty((sum(received), x.shape[1]))
    dist.all_to_all_single(rows, np.ascontiguousarray(x[token[order]]),
                           output_split_sizes=received, input_split_sizes=sent)
    outputs = experts(rows, np.repeat(np.tile(np.arange(local), n), per_source.reshape(-1)))
    if not combine:
        return outputs
    back = np.empty((order.size, x.shape[1]))
    sizes = (sent, received) if swapped else (received, sent)
    dist.all_to_all_single(back, outputs, output_split_sizes=sizes[0], input_split_sizes=sizes[1])
    out = np.zeros(choices.shape + (x.shape[1],))
    if ungroup:
        out[token[order], which[order]] = back
    else:
        out[token, which] = back
    return out


def _counts_dropped_choices(*args):
    return _moe_exchange(*args, count_dropped=True)


def _rows_in_routing_order(*args):
    return _moe_exchange(*args, grouped=False)


def _no_combine(*args):
    return _moe_exchange(*args, combine=False)


def _combine_sizes_not_swapped(*args):
    return _moe_exchange(*args, swapped=False)


def _outputs_left_grouped(*args):
    return _moe_exchange(*args, ungroup=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,words", [
    (_counts_dropped_choices, "split sizes", [
        "sum to 12 rows, but you send", "a dropped choice is not sent and not counted",
        "in the dispatch (before your experts ran)"]),
    (_rows_in_routing_order, "routing order", [
        "on 2 ranks (top-1, capacity factor 1.0): rank 0 received expert 0's tokens from the "
        "wrong rows", "which rank 0 routed to expert", "group the rows by destination"]),
    (_no_combine, "missing combine", ["the outputs of its own experts for the 9 rows",
                                      "the combine is missing", "split sizes swapped"]),
    (_combine_sizes_not_swapped, "combine sizes", [
        "the dispatch's two lists, swapped", "in the combine (after your experts ran)"]),
    (_outputs_left_grouped, "wrong place", ["holds the output of another of its choices",
                                            "undo the grouping"]),
], ids=lambda value: value.__name__.strip("_") if callable(value) else "")
def test_moe_dispatch_mistakes_on_real_processes(function, kind, words):
    before = _segments()
    result = get("moe_dispatch").check(function)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


def test_rows_in_routing_order_are_replayed_beside_the_reference_dispatch():
    from viz.exercise_replay import side_by_side

    data = get("moe_dispatch").check(_rows_in_routing_order).replay
    assert data["difference"].startswith("your all_to_all 2, the dispatch")
    model = side_by_side(data["student"], data["reference"], data["first_difference"],
                         data["difference"])
    assert model.student.collective == model.reference.collective == "all_to_all"
    assert model.student.world_size == data["world_size"] == 2
    # same split sizes, so the same messages: what differs is which rows they carry
    assert not any(pair.differs for pair in model.pairs) and model.marked == 1
