"""The pipeline runtime must train exactly like one process on the whole batch.

One launch per world size (1, 2, 3, 4) runs every case inside the workers:
each schedule (GPipe, 1F1B, interleaved 1F1B with 2 chunks per rank) x
micro-batch counts {1, p - 1, p, p + 1, 2p} (13 examples, so most
micro-batches are uneven) x recomputation off/on, two SGD-with-momentum steps
each; the world of 4 also runs 2 stages x 2 data-parallel replicas. Each rank
returns its weights and gradients (by the full model's parameter names), its
loss, and the trace events of the second step. The parent compares with
single-process training in float64 to 1e-10 and reads the traces: the order
of the compute regions is the schedule's, the memory ledger's peak live
activations are m (GPipe) and min(p - s, m) (1F1B), recomputation keeps fewer
bytes, and the measured bubble.

The measured bubble of a real run depends on the machine's load, so it is
not compared with the formula within a tolerance (on a busy 2-core machine
any tolerance either flakes or says nothing). What holds whatever the load:
the simulator replaying the run's own measured F/B durations with free
messages gives the earliest the schedule could have finished, so its bubble
is a lower bound of the measured one, and the measured one is above 0 (the
last stage waits for the first forward) and below 1.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
from minidist import Tensor, nn, optim, trace
from minidist.parallel.pipeline import (
    Pipeline,
    annotate_trace,
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from minidist.parallel.pipeline.schedules import UNIT_NS

BATCH = 13
STEPS = 2
TOLERANCE = 1e-10
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def _model():
    """Eight Linear layers, so that 4 ranks x 2 chunks get one each."""
    nn.init.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Tanh()]
    for _ in range(6):
        layers += [nn.Linear(8, 8), nn.Tanh()]
    layers.append(nn.Linear(8, 3))
    return nn.Sequential(*layers).to(np.float64)


def _batches():
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(BATCH, 6)), rng.integers(0, 3, BATCH)) for _ in range(STEPS)]


def _shard(batch, replica, replicas):
    rows = np.array_split(np.arange(BATCH), replicas)[replica]
    return batch[0][rows], batch[1][rows]


def _cases(stages, data_parallel):
    counts = sorted({1, max(stages - 1, 1), stages, stages + 1, 2 * stages})
    return [dict(stages=stages, data_parallel=data_parallel, schedule=schedule,
                 microbatches=count, recompute=recompute)
            for schedule in SCHEDULES for count in counts for recompute in (False, True)]


def _key(case):
    return (case["stages"], case["data_parallel"], case["schedule"], case["microbatches"],
            case["recompute"])


def _virtual(case):
    return 2 if case["schedule"] == "interleaved_1f1b" else 1


def _train(cases):
    recorder = trace.current()
    results = {}
    for case in cases:
        model = _model()
        names = {id(p): name for name, p in model.named_parameters()}
        pipe = Pipeline(model, case["schedule"], case["microbatches"],
                        virtual_stages=_virtual(case), recompute=case["recompute"],
                        data_parallel=case["data_parallel"])
        optimizer = optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        for batch in _batches():
            x, y = _shard(batch, pipe.replica, pipe.data_parallel)
            first = len(recorder.events)
            loss = pipe.step(x, y if pipe.is_last else None, loss_fn, optimizer)
        results[_key(case)] = dict(
            rank=pipe.rank, replica=pipe.replica, loss=loss, examples=len(x),
            weights={names[id(p)]: p.data.copy() for p in pipe.parameters()},
            grads={names[id(p)]: p.grad.copy() for p in pipe.parameters()},
            events=[dict(zip(trace.FIELDS, e)) for e in recorder.events[first:]])
    return results


def _errors():
    """Bad input on one rank (p = 1, so nobody waits for it): each message."""

    def step(microbatches, x, y):
        pipe = Pipeline(_model(), "gpipe", microbatches)
        pipe.step(x, y, nn.CrossEntropyLoss(), optim.SGD(pipe.parameters(), lr=0.1))

    attempts = [
        lambda: Pipeline(_model(), "1f1b", 2, data_parallel=2),
        lambda: Pipeline(_model(), make_schedule("gpipe", 3, 2)),
        lambda: Pipeline([nn.Linear(2, 2)] * 2, "gpipe", 2),
        lambda: step(4, np.zeros((3, 6)), np.zeros(3, int)),
        lambda: step(2, np.zeros((3, 6)), None),
        lambda: Pipeline(_model(), "gpipe", 2).step(np.zeros((3, 6)), np.zeros(3, int),
                                                    nn.CrossEntropyLoss(), None),
    ]
    messages = []
    for attempt in attempts:
        try:
            attempt()
            messages.append(None)
        except (ValueError, TypeError) as error:
            messages.append(str(error))
    return messages


def _worker(cases, with_errors):
    return _train(cases), (_errors() if with_errors else None)


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


LAUNCHES = {1: [(1, 1)], 2: [(2, 1)], 3: [(3, 1)], 4: [(4, 1), (2, 2)]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """world size -> (per-rank results, error messages, trace path)."""
    folder = tmp_path_factory.mktemp("pipeline")
    outcome = {}
    for world, layouts in LAUNCHES.items():
        cases = [case for stages, replicas in layouts for case in _cases(stages, replicas)]
        path = folder / f"pipeline{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, args=(cases, world == 1),
                                  trace=path, timeout=60)
        outcome[world] = ([r[0] for r in results], results[0][1], path)
    return outcome


def _all_cases():
    return [(world, case) for world, layouts in LAUNCHES.items()
            for stages, replicas in layouts for case in _cases(stages, replicas)]


def _region_name(info):
    return f"{info['pipeline']}{info['mb']}" + (f"c{info['chunk']}" if info["chunk"] else "")


def _regions(events):
    """(name, info, event) of a rank's pipeline compute regions, in order."""
    out = []
    for event in sorted(events, key=lambda e: e["start"]):
        info = trace.label_info(event["label"]) if event["kind"] == "compute" else {}
        if info.get("pipeline") in ("F", "B", "R"):
            out.append((_region_name(info), info, event))
    return out


@pytest.mark.blas_kernel
@pytest.mark.timeout(600)
def test_weights_gradients_and_loss_equal_single_process_training(runs):
    weights, grads, loss = _reference()
    for world, case in _all_cases():
        per_rank = [results[_key(case)] for results in runs[world][0]]
        for replica in range(case["data_parallel"]):
            seen = {}
            for result in per_rank:
                if result["replica"] == replica:
                    seen.update({name: (result["weights"][name], result["grads"][name])
                                 for name in result["weights"]})
            assert sorted(seen) == sorted(weights), case
            for name, (weight, grad) in seen.items():
                np.testing.assert_allclose(weight, weights[name], rtol=0, atol=TOLERANCE,
                                           err_msg=f"{case} {name}")
                np.testing.assert_allclose(grad, grads[name], rtol=0, atol=TOLERANCE,
                                           err_msg=f"{case} {name} grad")
        last = [r for r in per_rank if r["rank"] == case["stages"] - 1]
        assert all(r["loss"] is None for r in per_rank if r["rank"] != case["stages"] - 1)
        # replicas' losses are their shard's means: weighted by examples, the batch's
        mean = sum(r["loss"] * r["examples"] for r in last) / BATCH
        assert abs(mean - loss) < TOLERANCE, case


def test_the_trace_shows_the_schedule_it_ran(runs):
    for world, case in _all_cases():
        schedule = make_schedule(case["schedule"], case["stages"], case["microbatches"],
                                 _virtual(case))
        for result in runs[world][0]:
            result = result[_key(case)]
            regions = _regions(result["events"])
            names = [name for name, _, _ in regions]
            if case["recompute"]:
                for index, name in enumerate(names):
                    if name.startswith("B"):
                        assert names[index - 1] == "R" + name[1:], case
                names = [name for name in names if not name.startswith("R")]
            else:
                assert not any(name.startswith("R") for name in names)
            assert names == schedule.compute_order(result["rank"]), case
            for _, info, _ in regions:
                assert info["stage"] == schedule.stage_of(result["rank"], info["chunk"])
            messages = [e for e in result["events"] if e["kind"] in ("send", "recv")
                        and trace.label_info(e["label"]).get("pipeline") in ("act", "grad")]
            assert len(messages) == sum(a.kind.startswith(("send", "recv"))
                                        for a in schedule.actions[result["rank"]])


def _ledger(events):
    return [trace.label_info(e["label"]) for e in sorted(events, key=lambda e: e["start"])
            if e["kind"] == "memory"]


def test_memory_ledger_peak_live_activations(runs):
    for world, case in _all_cases():
        if case["schedule"] == "interleaved_1f1b":
            continue
        p, m = case["stages"], case["microbatches"]
        for result in runs[world][0]:
            result = result[_key(case)]
            peak = peak_live_microbatches(result["events"])[dist_rank(result, case)]
            stage = result["rank"]
            assert peak == (m if case["schedule"] == "gpipe" else min(p - stage, m)), case


def dist_rank(result, case):
    return result["replica"] * case["stages"] + result["rank"]


def test_memory_ledger_bytes_and_recomputation(runs):
    for world, case in _all_cases():
        if case["recompute"]:
            continue
        recomputed = dict(case, recompute=True)
        for results in runs[world][0]:
            plain, lean = results[_key(case)], results[_key(recomputed)]
            ledger = _ledger(plain["events"])
            params = sum(w.nbytes for w in plain["weights"].values())
            assert {entry["params"] for entry in ledger} == {params}
            assert ledger[0]["grads"] == 0 and ledger[0]["activations"] == 0
            assert ledger[-1]["grads"] == params and ledger[-1]["live_microbatches"] == 0
            assert ledger[-1]["optimizer"] == params  # one momentum buffer per parameter
            # recomputation keeps only stage inputs between forward and backward (the
            # full activations of one micro-batch exist only from its R to its B)
            peak_plain = max(entry["activations"] for entry in ledger)
            peak_lean = max(entry["activations"] for entry in _ledger(lean["events"]))
            assert peak_lean <= peak_plain, case
            if case["schedule"] == "gpipe" and case["microbatches"] > 1:
                assert peak_lean < peak_plain, case


def test_measured_bubble_is_at_least_what_its_own_durations_allow(runs):
    measured = []
    for world, case in _all_cases():
        if case["data_parallel"] > 1 or case["recompute"] or case["stages"] == 1:
            continue
        schedule = make_schedule(case["schedule"], case["stages"], case["microbatches"],
                                 _virtual(case))
        events, durations = [], {}
        for result in runs[world][0]:
            for _, info, event in _regions(result[_key(case)]["events"]):
                events.append(event)
                durations[(info["pipeline"], info["stage"], info["mb"])] = \
                    (event["end"] - event["start"]) / UNIT_NS
        real = bubble_fraction(events, case["stages"])
        replay = simulate_schedule(
            schedule,
            lambda stage, mb, durations=durations: durations[("F", stage, mb)],
            lambda stage, mb, durations=durations: durations[("B", stage, mb)])
        earliest = bubble_fraction(replay, case["stages"])
        assert 0 < real < 1, case
        assert earliest <= real + 1e-6, (case, earliest, real)
        measured.append(real)
    # micro-batch counts: p = 2 {1, 2, 3, 4}, p = 3 {1, 2, 3, 4, 6}, p = 4 {1, 3, 4, 5, 8}
    assert len(measured) == len(SCHEDULES) * (4 + 5 + 5)


def test_trace_file_and_header(runs, tmp_path):
    _, _, path = runs[2]
    annotate_trace(path, make_schedule("1f1b", 2, 4))
    written = trace.read_jsonl(path)
    assert written.header["schedule"] == "1f1b" and written.header["stages"] == 2
    assert written.header["microbatches"] == 4 and written.header["virtual_stages"] == 1
    assert any(e["kind"] == "memory" for e in written.events)


def test_bad_input_is_a_clear_error(runs):
    messages = runs[1][1]
    assert "data_parallel=2 must be a whole number >= 1 that divides the world size 1" \
        in messages[0]
    assert "the schedule is for 3 stages, the launch has 1" in messages[1]
    assert "got 2 stages, the schedule needs 1" in messages[2]
    assert "rank 0: a batch of 3 examples cannot be cut into 4 micro-batches" in messages[3]
    assert "rank 0 holds the last stage: pass the targets y" in messages[4]
    assert "rank 0: step() needs the optimizer" in messages[5]
