"""The pipeline runtime with the backward split in two (I, its input half;
W, its weight half) and the V placement must train exactly like one
process on the whole batch, and fail cleanly inside I or W.

One launch per world size (2, 4) and transport (pipe, shm) runs every case
inside the workers, three SGD-with-momentum steps in float64 on a batch of
13 examples (uneven micro-batches), on p = 2 and 4 stages and on 2 stages x
2 data-parallel replicas, with m = p and 2p + 1 micro-batches (2p and 2p + 1 for DualPipeV):

* the schedules of before the split: GPipe, 1F1B, interleaved 1F1B (2
  chunks per rank), as a check that nothing they compute has moved;
* 1F1B and interleaved 1F1B with each B split into I and W, W one compute
  action after its I ("next") or every W at the end of the rank's batch
  ("end": the most held for W);
* the V placement (chunk 0 at stage r, chunk 1 at stage 2p - 1 - r; rank 0
  holds the first and the last stage, rank p - 1 hands over from stage p - 1
  to stage p in memory), with whole backwards and with I and W;
* recomputation with I and W, on the loop and the V placement;
* the zero-bubble schedules of :func:`make_schedule` that exist
  (``zb_h1``, ``zb_h2``, ``zbv``, ``dualpipev``).

Every rank returns its weights and gradients by the full model's names, its
loss and the trace events of its last step; the parent compares them with
one process's training (rtol 1e-9) and reads the traces: the compute order
is the schedule's, and the memory events count what waits for W.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.parallel.pipeline import (
    SCHEDULES,
    Pipeline,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    schedule_from_order,
    simulate_schedule,
)

BATCH = 13
STEPS = 3
RTOL, ATOL = 1e-9, 1e-13
ZERO_BUBBLE = ("zb_h1", "zb_h2", "zbv", "dualpipev")


def _model():
    """Eight Linear layers, so that 4 ranks x 2 chunks get one each."""
    nn.init.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Tanh()]
    for _ in range(6):
        layers += [nn.Linear(8, 8), nn.Tanh()]
    layers.append(nn.Linear(8, 3))
    return nn.Sequential(*layers).to(np.float64)


def _batches():
    rng = np.random.default_rng(11)
    return [(rng.normal(size=(BATCH, 6)), rng.integers(0, 3, BATCH)) for _ in range(STEPS)]


# --------------------------------------------------------------------------- hand-made orders


def _compute(schedule, rank):
    return [(a.kind, a.microbatch, a.chunk, a.phase) for a in schedule.actions[rank]
            if a.kind in ("forward", "backward")]


def _split(order, rule):
    """``order``'s B as I, each W placed one compute action after its I
    ("next") or all at the end ("end")."""
    out, waiting = [], []
    for kind, microbatch, chunk, phase in order:
        out.append(("F" if kind == "forward" else "I", microbatch, chunk, phase))
        if rule == "next":
            out.extend(waiting)
            waiting = []
        if kind != "forward":
            waiting.append(("W", microbatch, chunk, phase))
    return out + waiting


def _loop_split(base, p, m, rule):
    schedule = base(p, m) if base is one_f_one_b else base(p, m, 2)
    orders = [_split(_compute(schedule, rank), rule) for rank in range(p)]
    return schedule_from_order(f"{schedule.name}_iw_{rule}", p, m, schedule.virtual_stages,
                               orders)


def _v_order(p, m, rule):
    """On the V placement: every forward of chunk 0, then of chunk 1, then
    the backwards of chunk 1 and of chunk 0 (GPipe's order on the V): whole
    backwards (``rule`` None) or split by ``rule``."""
    orders = []
    for _rank in range(p):  # every rank runs the same order
        order = [("forward", mb, 0, "warmup") for mb in range(m)]
        order += [("forward", mb, 1, "warmup") for mb in range(m)]
        order += [("backward", mb, 1, "cooldown") for mb in range(m)]
        order += [("backward", mb, 0, "cooldown") for mb in range(m)]
        if rule is None:
            orders.append([("F" if kind == "forward" else "B", mb, chunk, phase)
                           for kind, mb, chunk, phase in order])
        else:
            orders.append(_split(order, rule))
    return schedule_from_order(f"v_{rule or 'whole'}", p, m, 2, orders, placement="v")


def _schedule(name, p, m):
    if name in ("gpipe", "1f1b"):
        return make_schedule(name, p, m)
    if name == "interleaved_1f1b":
        return make_schedule(name, p, m, 2)
    if name in ZERO_BUBBLE:
        return make_schedule(name, p, m)
    base, rule = name.rsplit(" ", 1)
    if base == "1f1b":
        return _loop_split(one_f_one_b, p, m, rule)
    if base == "interleaved_1f1b":
        return _loop_split(interleaved_one_f_one_b, p, m, rule)
    return _v_order(p, m, None if rule == "whole" else rule)


NAMES = ["gpipe", "1f1b", "interleaved_1f1b", "1f1b next", "1f1b end",
         "interleaved_1f1b next", "interleaved_1f1b end", "v whole", "v next", "v end",
         *[name for name in ZERO_BUBBLE if name in SCHEDULES]]
RECOMPUTED = ["1f1b next", "v end"]


def _counts(name, stages):
    """p and 2p + 1 micro-batches; DualPipeV needs at least 2p (DeepSeek's rule)."""
    return (2 * stages, 2 * stages + 1) if name == "dualpipev" else (stages, 2 * stages + 1)


def _cases(stages, replicas):
    return [dict(stages=stages, replicas=replicas, name=name, microbatches=m,
                 recompute=recompute)
            for name in NAMES for m in _counts(name, stages)
            for recompute in ((False, True) if name in RECOMPUTED else (False,))]


def _key(case):
    return (case["stages"], case["replicas"], case["name"], case["microbatches"],
            case["recompute"])


LAUNCHES = {2: [(2, 1)], 4: [(4, 1), (2, 2)]}


def _train(cases):
    recorder = trace.current()
    results = {}
    for case in cases:
        model = _model()
        names = {id(p): name for name, p in model.named_parameters()}
        schedule = _schedule(case["name"], case["stages"], case["microbatches"])
        pipe = Pipeline(model, schedule, recompute=case["recompute"],
                        data_parallel=case["replicas"])
        optimizer = optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
        for x, y in _batches():
            rows = np.array_split(np.arange(BATCH), pipe.data_parallel)[pipe.replica]
            first = len(recorder.events)
            loss = pipe.step(x[rows], y[rows] if pipe.is_last else None, nn.CrossEntropyLoss(),
                             optimizer)
        results[_key(case)] = dict(
            rank=pipe.rank, replica=pipe.replica, loss=loss, examples=len(rows),
            weights={names[id(p)]: p.data.copy() for p in pipe.parameters()},
            grads={names[id(p)]: p.grad.copy() for p in pipe.parameters()},
            events=[dict(zip(trace.FIELDS, e)) for e in recorder.events[first:]])
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(world, transport) -> per-rank results."""
    folder = tmp_path_factory.mktemp("split")
    outcome = {}
    for world, layouts in LAUNCHES.items():
        cases = [case for stages, replicas in layouts for case in _cases(stages, replicas)]
        for transport in ("pipe", "shm"):
            outcome[(world, transport)] = minidist.launch(
                _train, world_size=world, transport=transport, args=(cases,),
                trace=folder / f"{world}{transport}.jsonl", timeout=120)
    return outcome


def _reference():
    model = _model()
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches():
        optimizer.zero_grad()
        loss = nn.CrossEntropyLoss()(model(Tensor(x)), y)
        loss.backward()
        optimizer.step()
    return ({name: p.data for name, p in model.named_parameters()},
            {name: p.grad for name, p in model.named_parameters()}, loss.item())


def _all_cases():
    return [(world, transport, case) for world, layouts in LAUNCHES.items()
            for transport in ("pipe", "shm")
            for stages, replicas in layouts for case in _cases(stages, replicas)]


def test_every_schedule_trains_like_one_process(runs):
    weights, grads, loss = _reference()
    checked = 0
    for world, transport, case in _all_cases():
        per_rank = [results[_key(case)] for results in runs[(world, transport)]]
        for replica in range(case["replicas"]):
            seen = {}
            for result in per_rank:
                if result["replica"] == replica:
                    seen.update({name: (result["weights"][name], result["grads"][name])
                                 for name in result["weights"]})
            assert sorted(seen) == sorted(weights), case
            for name, (weight, grad) in seen.items():
                np.testing.assert_allclose(weight, weights[name], rtol=RTOL, atol=ATOL,
                                           err_msg=f"{transport} {case} {name}")
                np.testing.assert_allclose(grad, grads[name], rtol=RTOL, atol=ATOL,
                                           err_msg=f"{transport} {case} {name} grad")
        schedule = _schedule(case["name"], case["stages"], case["microbatches"])
        holder = schedule.rank_of(schedule.total_stages - 1)[0]
        last = [r for r in per_rank if r["rank"] == holder]
        assert all(r["loss"] is None for r in per_rank if r["rank"] != holder), case
        mean = sum(r["loss"] * r["examples"] for r in last) / BATCH
        assert abs(mean - loss) <= RTOL * abs(loss), case
        checked += 1
    assert checked == len(_all_cases())


def _compute_regions(events):
    out = []
    for event in sorted(events, key=lambda e: e["start"]):
        info = trace.label_info(event["label"]) if event["kind"] == "compute" else {}
        if info.get("pipeline") in ("F", "B", "R", "I", "W"):
            out.append((f"{info['pipeline']}{info['mb']}" + (f"c{info['chunk']}"
                                                              if info["chunk"] else ""), info))
    return out


def _memory(events):
    return [trace.label_info(e["label"]) for e in sorted(events, key=lambda e: e["start"])
            if e["kind"] == "memory"]


def test_the_trace_shows_the_order_and_what_waits_for_w(runs):
    for world, transport, case in _all_cases():
        if transport != "shm":
            continue
        schedule = _schedule(case["name"], case["stages"], case["microbatches"])
        splits = any(a.kind == "backward_weight" for actions in schedule.actions for a in actions)
        for results in runs[(world, transport)]:
            result = results[_key(case)]
            regions = _compute_regions(result["events"])
            names = [name for name, _ in regions]
            if case["recompute"]:
                for index, name in enumerate(names):
                    if name[0] in "BI":
                        assert names[index - 1] == "R" + name[1:], case
                names = [name for name in names if name[0] != "R"]
            assert names == schedule.compute_order(result["rank"]), case
            for _, info in regions:
                assert info["stage"] == schedule.stage_of(result["rank"], info["chunk"]), case
            ledger = _memory(result["events"])
            if not splits:
                assert not any("weights_pending" in entry for entry in ledger), case
                continue
            assert all(entry["activations"] >= entry["weights_pending_bytes"] for entry in ledger)
            assert ledger[-1]["weights_pending"] == 0 and ledger[-1]["activations"] == 0
            pending = [entry["weights_pending"] for entry in ledger]
            assert all((n > 0) == (entry["weights_pending_bytes"] > 0)
                       for n, entry in zip(pending, ledger)), case
            # a piece is live from its forward to its W, as the simulator counts it
            assert all(entry["live_microbatches"] >= entry["weights_pending"] for entry in ledger)
            if case["name"].endswith(" end"):
                # every W at the end: all of the rank's pieces wait at once
                pieces = case["microbatches"] * schedule.virtual_stages
                assert max(pending) == pieces, case
                assert max(entry["live_microbatches"] for entry in ledger) == pieces, case


def _after_compute(events):
    """(live_microbatches, weights_pending) of each memory event that follows
    a forward, a backward or one of its halves, in the order recorded (a
    region is recorded as it ends, its memory event right after)."""
    seen, letter = [], None
    for event in events:
        info = trace.label_info(event["label"])
        if event["kind"] == "compute":
            letter = info.get("pipeline")
        elif event["kind"] == "memory" and letter in ("F", "B", "I", "W"):
            seen.append((info["live_microbatches"], info.get("weights_pending", 0)))
            letter = None
    return seen


def test_the_memory_events_count_as_the_simulator_counts(runs):
    compared = 0
    for world, transport, case in _all_cases():
        schedule = _schedule(case["name"], case["stages"], case["microbatches"])
        if transport != "shm" or case["replicas"] > 1 or not any(
                a.kind == "backward_weight" for actions in schedule.actions for a in actions):
            continue
        try:
            planned = simulate_schedule(schedule)
        except ValueError as error:
            pytest.skip(f"the simulator does not run split backwards here: {error}")
        for results in runs[(world, transport)]:
            result = results[_key(case)]
            rank = result["rank"]
            expected = [(info["live_microbatches"], info.get("weights_pending", 0))
                        for info in (trace.label_info(e["label"]) for e in planned
                                     if e["kind"] == "memory" and e["rank"] == rank)]
            assert _after_compute(result["events"]) == expected, (case, rank)
            compared += 1
    assert compared


# --------------------------------------------------------------------------- refusals


def _refusals():
    """Schedules that a rank cannot run (p = 1, nobody waits): each message."""
    def run(orders, v=1):
        schedule = schedule_from_order("bad", 1, 2, v, [orders])
        pipe = Pipeline(_model(), schedule)
        pipe.step(np.zeros((4, 6)), np.zeros(4, int), nn.CrossEntropyLoss(),
                  optim.SGD(pipe.parameters(), lr=0.1))

    attempts = {
        "no W": [("F", 0, 0, ""), ("F", 1, 0, ""), ("I", 0, 0, ""), ("I", 1, 0, ""),
                 ("W", 1, 0, "")],
        "W before I": [("F", 0, 0, ""), ("F", 1, 0, ""), ("W", 0, 0, ""), ("I", 0, 0, ""),
                       ("B", 1, 0, "")],
        "I before F": [("I", 0, 0, ""), ("F", 0, 0, "")],
        "W twice": [("F", 0, 0, ""), ("F", 1, 0, ""), ("I", 0, 0, ""), ("W", 0, 0, ""),
                    ("W", 0, 0, ""), ("B", 1, 0, "")],
    }
    found = {}
    for name, orders in attempts.items():
        try:
            run(orders)
            found[name] = None
        except RuntimeError as error:
            found[name] = str(error)
    try:
        Pipeline({3: _model()}, make_schedule("gpipe", 1, 2))
        found["wrong stages"] = None
    except ValueError as error:
        found["wrong stages"] = str(error)
    return found


def test_a_schedule_that_cannot_run_is_refused_by_name():
    found = minidist.launch(_refusals, world_size=1, timeout=60)[0]
    assert "rank 0: schedule 'bad' steps before the weight half W of (micro-batch, chunk) " \
           "[(0, 0)] has run" in found["no W"]
    assert "Give every I its W before the step" in found["no W"]
    assert "action 2 (W0) of schedule 'bad': runs before its input half I" in found["W before I"]
    assert "action 0 (I0) of schedule 'bad': runs before its forward" in found["I before F"]
    assert "action 4 (W0) of schedule 'bad': runs before its input half I (or twice)" \
        in found["W twice"]
    assert "rank 0: got stages [3]; on schedule 'gpipe' (loop placement, 1 ranks x 1 stages) " \
           "this rank holds stages [0]" in found["wrong stages"]


# --------------------------------------------------------------------------- failures


class _RaiseInBackward(nn.Module):
    """The identity, whose backward raises on global rank ``rank``."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        def backward(grad):
            if dist.get_rank() == self.rank:
                raise ValueError("the input half raised on purpose")
            return (grad,)

        return Tensor._make(x.data, (x,), backward, "raise_in_backward")


def _fail_inside(where):
    """2 stages, 1F1B split with every W at the end; rank 1 raises inside
    an I (a layer's backward on the input's path), or rank 0 inside a W (a
    parameter's post-accumulate hook: the parameters' gradients are W's)."""
    nn.init.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(6, 8), nn.Tanh()).to(np.float64),
              nn.Sequential(_RaiseInBackward(1 if where == "I" else -1),
                            nn.Linear(8, 3)).to(np.float64)]
    if where == "W" and dist.get_rank() == 0:
        def raise_in_weight_half(parameter):
            raise ValueError("the weight half raised on purpose")

        stages[0][0].weight.register_post_accumulate_grad_hook(raise_in_weight_half)
    pipe = Pipeline(stages, _loop_split(one_f_one_b, 2, 4, "end"))
    optimizer = optim.SGD(pipe.parameters(), lr=0.1)
    x, y = _batches()[0]
    for _ in range(3):
        pipe.step(x, y, nn.CrossEntropyLoss(), optimizer)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
@pytest.mark.parametrize("where,rank", [("I", 1), ("W", 0)])
def test_a_failure_inside_i_or_w_ends_the_run_naming_its_rank(where, rank, transport):
    start = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_fail_inside, world_size=2, transport=transport, args=(where,),
                        timeout=60)
    elapsed = time.monotonic() - start
    first = str(caught.value).splitlines()[0]
    assert caught.value.rank == rank, first
    assert first.startswith(f"rank {rank} failed with ValueError: the "
                            f"{'input' if where == 'I' else 'weight'} half raised on purpose"), \
        first
    assert elapsed < 10, f"took {elapsed:.1f} s"
