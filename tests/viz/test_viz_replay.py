"""The replay model against the algorithms' definitions.

Three sources of traces: hand-made events (the label format alone), real
runs on shared memory (one launch per world size running every case), and
the simulator. Frame counts are checked against the algorithms' step counts
and holdings against the reference computations of tests/viz/viz_reference.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed import simulate
from tests.viz.viz_reference import (
    binomial_broadcast_holders,
    recursive_doubling_holdings,
    ring_all_gather_holdings,
    ring_all_reduce_events,
    ring_all_reduce_holdings,
)
from viz.replay import Replay, layout_of, replay, replays

WORLD_SIZES = (2, 3, 4, 5, 8)


def _log2(n: int) -> int:
    return (n - 1).bit_length()


def _fold_steps(n: int) -> int:
    return 0 if n & (n - 1) == 0 else 2


def _as_lists(holdings):
    return [list(row) for row in holdings]


# --------------------------------------------------------------------------- hand-made events


@pytest.mark.parametrize("n", range(2, 9))
def test_hand_made_ring_matches_the_reference(n):
    ring = replay(ring_all_reduce_events(n, 3 * n + 1))
    assert (ring.collective, ring.algorithm, ring.world_size, ring.layout) == \
        ("all_reduce", "ring", n, "ring")
    assert ring.steps == 2 * (n - 1) and len(ring.frames) == ring.steps + 1
    assert _as_lists(ring.initial) == [[frozenset({r})] * n for r in range(n)]
    # Frame 0 is the state before any message: no messages, the initial holdings.
    first = ring.frames[0]
    assert (first.index, first.step, first.messages, first.elapsed_ns) == (0, -1, (), 0)
    assert first.holdings == ring.initial
    for frame in ring.frames[1:]:
        assert frame.step == frame.index - 1
        assert _as_lists(frame.holdings) == ring_all_reduce_holdings(n, frame.step)
        assert frame.phase == ("reduce-scatter" if frame.step < n - 1 else "allgather")
        assert len(frame.messages) == n
        assert {(m.source, m.target) for m in frame.messages} == {(r, (r + 1) % n)
                                                                  for r in range(n)}
    assert ring.frames[-1].complete == 1.0


def test_hand_made_message_fields():
    ring = replay(ring_all_reduce_events(4, 8, itemsize=4, step_ns=1000))
    first = ring.frames[1].messages[0]
    assert (first.source, first.target, first.nbytes, first.op, first.cells) == \
        (0, 1, 8, "combine", (0, 1))
    assert first.text == "reduce-scatter step 0 chunk 0"
    assert 0 <= first.start_ns < first.end_ns <= ring.frames[1].elapsed_ns
    assert ring.frames[4].messages[0].op == "copy"
    assert ring.measured_s == pytest.approx(6 * 1000e-9 + 3e-9)
    assert ring.predicted_s > 0 and "α" in ring.formula and "γ" in ring.formula \
        and "βₓ" in ring.formula and "xbeta" not in ring.formula


def test_several_calls_in_one_trace_are_told_apart():
    events = ring_all_reduce_events(3, 9, call=0) + [
        dict(event, start=event["start"] + 10**6, end=event["end"] + 10**6)
        for event in ring_all_reduce_events(3, 30, call=1)]
    found = replays(events)
    assert [(r.call, r.count, r.steps) for r in found] == [(0, 9, 4), (1, 30, 4)]
    assert replay(events, 1).count == 30


def test_a_trace_without_collectives_says_so():
    with pytest.raises(ValueError, match="no collective call"):
        replay([])
    with pytest.raises(IndexError, match="1 collective calls"):
        replay(ring_all_reduce_events(2, 4), 3)


def test_layouts():
    assert layout_of("ring") == "ring"
    assert layout_of("binomial") == layout_of("double_binary_tree") == "tree"
    assert layout_of("recursive_doubling") == "row"


# --------------------------------------------------------------------------- real runs


def _every_case(count: int) -> int:
    n = dist.get_world_size()
    rank = dist.get_rank()
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
        dist.all_reduce(np.arange(count, dtype=np.int64) + rank, algorithm=algorithm)
    for root in (0, n - 1):
        dist.broadcast(np.full(count, rank, np.int64), src=root, algorithm="binomial")
    output = np.zeros(n * count, np.int64)
    dist.all_gather_into_tensor(output, np.full(count, rank, np.int64), algorithm="ring")
    dist.reduce_scatter_tensor(np.zeros(count, np.int64),
                               np.arange(n * count, dtype=np.int64), algorithm="ring")
    return rank


@pytest.fixture(scope="module")
def real_replays(tmp_path_factory) -> dict[int, list[Replay]]:
    """Every case on every world size: one shm launch per world size."""
    found = {}
    for n in WORLD_SIZES:
        path = tmp_path_factory.mktemp("traces") / f"cases{n}.jsonl"
        assert minidist.launch(_every_case, world_size=n, transport="shm", args=(4 * n + 3,),
                               trace=str(path), timeout=60) == list(range(n))
        found[n] = replays(path)
    return found


def _case(found: list[Replay], collective: str, algorithm: str, root=None) -> Replay:
    matching = [r for r in found if (r.collective, r.algorithm) == (collective, algorithm)
                and (root is None or r.root == root)]
    assert matching, f"no {collective} {algorithm} in the trace"
    return matching[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_real_frame_counts_are_the_algorithms_steps(real_replays, n):
    found = real_replays[n]
    assert len(found) == 7
    p = 1 << (n.bit_length() - 1)
    expected = {
        ("all_reduce", "ring"): 2 * (n - 1),
        ("all_reduce", "recursive_doubling"): int(math.log2(p)) + _fold_steps(n),
        ("all_reduce", "rabenseifner"): 2 * int(math.log2(p)) + _fold_steps(n),
        ("broadcast", "binomial"): _log2(n),
        ("all_gather", "ring"): n - 1,
        ("reduce_scatter", "ring"): n - 1,
    }
    for (collective, algorithm), steps in expected.items():
        assert _case(found, collective, algorithm).steps == steps, (collective, algorithm)
    for one in found:
        assert one.world_size == n and one.transport == "shm"
        assert one.measured_s > 0 and one.predicted_s and one.predicted_s > 0
        assert one.formula
        elapsed = [frame.elapsed_ns for frame in one.frames]
        assert elapsed == sorted(elapsed)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_real_ring_all_reduce_holdings(real_replays, n):
    ring = _case(real_replays[n], "all_reduce", "ring")
    for frame in ring.frames:
        assert _as_lists(frame.holdings) == ring_all_reduce_holdings(n, frame.step)
        if frame.index:
            assert frame.phase == ("reduce-scatter" if frame.step < n - 1 else "allgather")
        assert all(m.nbytes > 0 for m in frame.messages)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_real_every_all_reduce_ends_complete(real_replays, n):
    everyone = frozenset(range(n))
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
        last = _case(real_replays[n], "all_reduce", algorithm).frames[-1]
        assert all(cell == everyone for row in last.holdings for cell in row), algorithm


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", (2, 4, 8))
def test_real_recursive_doubling_holdings(real_replays, n):
    doubling = _case(real_replays[n], "all_reduce", "recursive_doubling")
    for frame in doubling.frames:
        expected = recursive_doubling_holdings(n, frame.step)
        assert _as_lists(frame.holdings) == [[expected[rank]] * n for rank in range(n)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_real_binomial_broadcast_holdings(real_replays, n):
    for root in (0, n - 1):
        tree = _case(real_replays[n], "broadcast", "binomial", root)
        assert tree.root == root and tree.layout == "tree"
        for frame in tree.frames:
            holders = {rank for rank in range(n)
                       if all(cell == {root} for cell in frame.holdings[rank])}
            empty = {rank for rank in range(n) if not any(frame.holdings[rank])}
            assert holders == binomial_broadcast_holders(n, root, frame.step)
            assert empty == set(range(n)) - holders


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_real_ring_all_gather_and_reduce_scatter(real_replays, n):
    gather = _case(real_replays[n], "all_gather", "ring")
    for frame in gather.frames:
        assert _as_lists(frame.holdings) == ring_all_gather_holdings(n, frame.step)
    scatter = _case(real_replays[n], "reduce_scatter", "ring")
    # reduce_scatter's definition: rank r ends with piece r combined over every rank.
    assert all(scatter.frames[-1].holdings[rank][rank] == frozenset(range(n))
               for rank in range(n))


# --------------------------------------------------------------------------- the simulator


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", range(2, 9))
def test_simulated_ring_matches_the_reference(tmp_path, n):
    path = tmp_path / "ring.jsonl"
    result = simulate("all_reduce", "ring", n, 1 << 20, trace=path)
    ring = replay(path)
    assert ring.steps == 2 * (n - 1)
    for frame in ring.frames:
        assert _as_lists(frame.holdings) == ring_all_reduce_holdings(n, frame.step)
    assert ring.transport == "sim"
    assert ring.measured_s == pytest.approx(result.time, abs=1e-9)  # whole virtual ns
    assert ring.predicted_s == pytest.approx(result.predicted, rel=1e-9)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", (3, 6, 8))
def test_simulated_binomial_broadcast(tmp_path, n):
    path = tmp_path / "broadcast.jsonl"
    simulate("broadcast", "binomial", n, 4096, root=1, trace=path)
    tree = replay(path)
    assert tree.steps == _log2(n)
    for frame in tree.frames:
        holders = {rank for rank in range(n) if all(cell == {1} for cell in frame.holdings[rank])}
        assert holders == binomial_broadcast_holders(n, 1, frame.step)


@pytest.mark.timeout(120)
def test_simulated_64_ranks_is_a_summary(tmp_path):
    path = tmp_path / "ring64.jsonl"
    simulate("all_reduce", "ring", 64, 1 << 20, trace=path)
    big = replay(path)
    assert big.summary and big.world_size == 64 and big.steps == 126
    assert [frame.complete for frame in big.frames] == sorted(frame.complete
                                                             for frame in big.frames)
    assert big.frames[-1].complete == 1.0


def test_cells_without_elements_hold_nothing_and_count_as_complete(tmp_path):
    # 1 element on 3 ranks: cells 1 and 2 are empty; no message writes them,
    # so they must hold nothing from the start, not rank r's data forever.
    path = tmp_path / "tiny.jsonl"
    simulate("all_reduce", "ring", world_size=3, nbytes=8, dtype=np.int64, trace=path)
    ring = replay(path)
    assert (ring.count, ring.cells) == (1, 3)
    everyone = frozenset(range(3))
    for rank in range(3):
        assert ring.initial[rank] == (frozenset({rank}), frozenset(), frozenset())
        assert ring.frames[-1].holdings[rank] == (everyone, frozenset(), frozenset())
    assert ring.frames[-1].complete == 1.0
    assert ring.frames[0].complete == pytest.approx(2 / 3)  # the 6 empty cells are done
    assert ring.frames[1].complete == pytest.approx(2 / 3)  # nothing final yet after step 1


# --------------------------------------------------------------------------- measured vs model


def _stretched_ring(n: int, header: dict, call: int = 1) -> Replay:
    """A ring all_reduce whose steps take 1 ms each (far above the model's
    microseconds), under ``header``."""
    from minidist import trace as _trace

    events = ring_all_reduce_events(n, count=16, call=call, step_ns=1_000_000)
    return replay(_trace.Trace(header, events))


def test_the_gap_names_the_run_facts_of_the_header():
    from minidist import trace as _trace
    from viz.replay import model_gap

    crowded = _stretched_ring(4, _trace.make_header(4, transport="shm", cores=2, load=5.0))
    assert (crowded.cores, crowded.load, crowded.params) == (2, 5.0, "default")
    words = model_gap(crowded)
    assert "4 ranks on 2 cores: ranks take turns" in words
    assert "machine busy (load 5.0 on 2 cores)" in words
    assert "default shm alpha/beta" in words
    assert "`minidist simulate all_reduce --algorithm ring -n 4 --size 128B` or with -n 2" \
        in words
    assert "first call" not in words  # call 1: warmed up

    roomy = _stretched_ring(4, _trace.make_header(4, transport="shm", cores=8, load=0.5),
                            call=0)
    words = model_gap(roomy)
    assert "take turns" not in words and "busy" not in words and "with -n" not in words
    assert "first call includes setup" in words

    old = _stretched_ring(4, _trace.make_header(4, transport="shm"))
    assert old.cores is None and "cores" not in model_gap(old)


def test_a_launch_records_its_cores_and_load(tmp_path):
    from minidist import trace as _trace
    from minidist.distributed.launch import cores

    path = tmp_path / "one.jsonl"
    minidist.launch(_every_case, world_size=2, args=(3,), trace=str(path), timeout=60)
    header = _trace.read_jsonl(path).header
    assert header["cores"] == cores()
    assert isinstance(header["load"], float) and header["load"] >= 0
    found = replays(path)[0]
    assert found.cores == cores() and found.slowest_message_s > 0
