"""The simulated bubble and peak memory of 1F1B, ZB-H1, ZB-H2, ZB-V and
DualPipeV against the papers' formulas and tables, written here from the
papers, not from the code under test.

Notation (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR
2024): F, B, W the times of a forward, of a backward's input half and of its
weight half, one stage, one micro-batch (the simulator takes
``forward_time=F, backward_time=B + W, weight_time=W``); p stages (ranks), m
micro-batches. For ZB-V and DualPipeV, with two chunks a rank, F, B, W are
a chunk's. DualPipe's table (DeepSeek's DualPipe repository, README) writes
B for the *whole* backward and F&B for a forward and a backward run as one
pair: on one process, F&B = F + B.

What is measured, from the simulated events of one batch (each rank's
compute regions F, B, I, W):

* the makespan: the last region's end minus the first's start;
* a rank's idle time: its span (its last region's end minus its first
  one's start) minus the time it computes; the paper's "bubble" of a
  schedule is the largest over the ranks, as in the authors' own bubble
  script (their efficiency.py: the makespan for ZB-H1, each rank's span for
  ZB-H2, whose batch is a parallelogram);
* a rank's peak of live (micro-batch, chunk) activations, from a forward
  until its B or its W (the memory ledger's live_microbatches), in units of
  a stage's activations of one micro-batch (M_B), or of a chunk's (half of
  it) for ZB-V and DualPipeV.

Every formula is checked on the grid p = 2..6, m from 1 to 4p (m < p, m = p,
2p - 1, 2p, more), and ten ratios F : B : W, equal and unequal, under the
conditions stated with each: where a formula's conditions do not hold it is
only a lower bound, and that is checked too. Each condition was found where
the formula stops being exact on this grid; the papers state theirs for
F = B = W (Qi et al.'s figures), for the measured costs of their runs (the
script's assertions: m >= 2p, W about half of F and B), and for PP even
(DualPipe).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from minidist import trace
from minidist.parallel.pipeline import (
    dualpipe_v,
    one_f_one_b,
    peak_live_microbatches,
    simulate_schedule,
    zb_h1,
    zb_h2,
    zb_v,
)
from minidist.parallel.pipeline.schedules import UNIT_NS

# F : B : W, B the input half. The first seven keep W <= min(F, B).
RATIOS = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1), (3, 2, 1), (1, 3, 1),
          (1, 1, Fraction(1, 2)), (1, 1, 2), (2, 1, 2), (1, 2, 3)]
STAGES = range(2, 7)


def _microbatches(p):
    return sorted({1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1, 4 * p} - {0})


def _run(schedule, F, B, W, split=True):
    """(makespan, [span of each rank], [idle of each rank], {rank: peak}) in units."""
    if split:
        events = simulate_schedule(schedule, float(F), float(B + W), weight_time=float(W))
    else:
        events = simulate_schedule(schedule, float(F), float(B + W))
    regions = [e for e in events if e["kind"] == "compute"
               and trace.label_info(e["label"]).get("pipeline") in ("F", "B", "I", "W")]
    spans, idles = [], []
    for rank in range(schedule.stages):
        mine = [e for e in regions if e["rank"] == rank]
        span = max(e["end"] for e in mine) - min(e["start"] for e in mine)
        busy = sum(e["end"] - e["start"] for e in mine)
        spans.append(Fraction(span, UNIT_NS))
        idles.append(Fraction(span - busy, UNIT_NS))
    makespan = Fraction(max(e["end"] for e in regions) - min(e["start"] for e in regions),
                        UNIT_NS)
    return makespan, spans, idles, peak_live_microbatches(events)


def _grid():
    for p in STAGES:
        for m in _microbatches(p):
            for F, B, W in RATIOS:
                yield p, m, Fraction(F), Fraction(B), Fraction(W)


def _balanced(F, B, W):
    """Where Qi et al.'s handcrafted schedules meet their formulas on this
    grid: no weight half longer than a forward or an input half."""
    return W <= F and W <= B


# --------------------------------------------------------------------------- 1F1B


@pytest.mark.parametrize("p", STAGES)
def test_one_f_one_b(p):
    """Bubble (p-1)(F+B+W) (Qi et al., Table 1, the whole backward B + W),
    stage s holds min(p - s, m) micro-batches: for every m and ratio."""
    for _, m, F, B, W in (case for case in _grid() if case[0] == p):
        makespan, _, idles, peaks = _run(one_f_one_b(p, m), F, B, W, split=False)
        assert makespan == m * (F + B + W) + (p - 1) * (F + B + W), (m, F, B, W)
        assert max(idles) == (p - 1) * (F + B + W)
        assert peaks == {s: min(p - s, m) for s in range(p)}


# --------------------------------------------------------------------------- ZB-H1


@pytest.mark.parametrize("p", STAGES)
def test_zb_h1(p):
    """Qi et al., Table 1: bubble (p-1)(F+B-W), peak memory p M_B (1F1B's),
    on every stage. Holds when m >= p and W <= min(F, B); the makespan is
    then m(F+B+W) + (p-1)(F+B-W). Otherwise a lower bound. With m < p (no
    steady state) and B >= F >= W: the last stage computes without a gap
    from (p-1)F on, m forwards and input halves; the last I goes back
    through p - 1 stages, and the first stage ends with its W:
    (p-1)F + m(F+B) + (p-1)B + W."""
    exact = 0
    for _, m, F, B, W in (case for case in _grid() if case[0] == p):
        makespan, _, idles, peaks = _run(zb_h1(p, m), F, B, W)
        bubble = makespan - m * (F + B + W)
        assert peaks == {s: min(p, m) for s in range(p)}
        if m >= p and _balanced(F, B, W):
            assert bubble == (p - 1) * (F + B - W), (m, F, B, W)
            assert max(idles) == bubble
            exact += 1
        else:
            assert bubble >= (p - 1) * (F + B - W), (m, F, B, W)
        if m < p and B >= F >= W:
            assert makespan == (p - 1) * F + m * (F + B) + (p - 1) * B + W, (m, F, B, W)
    assert exact >= 20


# --------------------------------------------------------------------------- ZB-H2


@pytest.mark.parametrize("p", STAGES)
def test_zb_h2(p):
    """Qi et al., Table 1: bubble (p-1)(F+B-2W), peak memory (2p-1) M_B: the
    largest idle time of a rank between its first forward and its last W,
    each rank's span being m(F+B+W) plus at most that (their script's
    measure). Holds when m >= 2p - 1 and W <= min(F, B); none when
    F = B = W (a parallelogram: rank r starts at r F and never waits, so the
    makespan is m(F+B+W) + (p-1)F). Otherwise a lower bound."""
    exact = 0
    for _, m, F, B, W in (case for case in _grid() if case[0] == p):
        makespan, spans, idles, peaks = _run(zb_h2(p, m), F, B, W)
        assert peaks == {s: min(2 * p - 1, m) for s in range(p)}
        if m >= 2 * p - 1 and _balanced(F, B, W):
            assert max(idles) == (p - 1) * (F + B - 2 * W), (m, F, B, W)
            assert max(spans) == m * (F + B + W) + (p - 1) * (F + B - 2 * W)
            exact += 1
        else:
            assert max(idles) >= (p - 1) * (F + B - 2 * W), (m, F, B, W)
        if m >= 2 * p - 1 and F == B == W:
            assert idles == [0] * p
            assert makespan == m * (F + B + W) + (p - 1) * F
    assert exact >= 10


# --------------------------------------------------------------------------- ZB-V


@pytest.mark.parametrize("p", STAGES)
def test_zb_v(p):
    """Qi et al., section 6: with F = B = W (a chunk's) and m >= 2p - 1, no
    rank idles from its first forward to its last W, each holding 2p
    chunks' activations, p M_B: 1F1B's. Its ranks start F apart: the
    makespan is 2m(F+B+W) + (p-1)F. With fewer micro-batches or unequal
    times it has a bubble (the paper then builds its V greedily)."""
    for _, m, F, B, W in (case for case in _grid() if case[0] == p):
        makespan, _, idles, peaks = _run(zb_v(p, m), F, B, W)
        if m >= 2 * p - 1:
            assert peaks == {r: 2 * p for r in range(p)}, m
        if m >= 2 * p - 1 and F == B == W:
            assert idles == [0] * p, (m, F)
            assert makespan == 2 * m * (F + B + W) + (p - 1) * F
        else:
            assert max(idles) >= 0


# --------------------------------------------------------------------------- DualPipeV


@pytest.mark.parametrize("p", STAGES)
def test_dualpipe_v(p):
    """DualPipe's table: bubble (PP/2-1)(F&B + B - 3W), B the whole backward,
    PP = 2p stages on p devices; activations PP + 1 chunks a device. On one
    process F&B = F + B: in Qi et al.'s notation (p-1)(F + 2(B+W) - 3W).
    Holds for m >= 2p (DeepSeek's own bound) when a forward takes as long
    as an input half (F = B, the table's own setting of equal chunks) and
    W <= F; the makespan then exceeds 2m(F+B+W) by the same amount."""
    exact = 0
    for _, m, F, B, W in (case for case in _grid() if case[0] == p):
        if m < 2 * p:
            with pytest.raises(ValueError, match="DualPipeV needs at least 2p"):
                dualpipe_v(p, m)
            continue
        makespan, spans, idles, peaks = _run(dualpipe_v(p, m), F, B, W)
        assert peaks == {r: 2 * p + 1 for r in range(p)}
        whole = B + W
        formula = (p - 1) * ((F + whole) + whole - 3 * W)
        if F == B and W <= F:
            assert max(idles) == formula, (m, F, B, W)
            assert makespan - 2 * m * (F + B + W) == formula
            exact += 1
    assert exact >= 4


# --------------------------------------------------------------------------- the tables


@pytest.mark.parametrize("p", STAGES)
def test_the_zero_bubble_readme_table(p):
    """The ZB repository's comparison, assuming T_F = T_B = T_W: bubble rate
    (bubble over the ideal m(F+B+W)) (p-1)/m for 1F1B, (p-1)/(3m) for ZB1P
    (= ZB-H1), 0 for ZB2P (= ZB-H2) and ZBV; activation memory 1x, 1x, 2x,
    1x of 1F1B's; pipeline communication volume 1x, 1x, 1x, 2x. ZBV holds
    the same model on the same p devices in 2p chunks, each half a stage:
    a chunk's F, B, W are half a stage's. "2x" is (2p - 1)/p, rounded."""
    stage = Fraction(2)  # a stage's F = B = W; a ZBV chunk's is 1
    for m in (2 * p, 3 * p, 4 * p + 1):
        ideal = m * 3 * stage
        rates, memory, messages = {}, {}, {}
        for name, schedule, chunk in [("1f1b", one_f_one_b(p, m), stage),
                                      ("zb1p", zb_h1(p, m), stage),
                                      ("zb2p", zb_h2(p, m), stage),
                                      ("zbv", zb_v(p, m), stage / 2)]:
            _, _, idles, peaks = _run(schedule, chunk, chunk, chunk, split=name != "1f1b")
            rates[name] = max(idles) / ideal
            size = Fraction(1, schedule.virtual_stages)  # of a stage's activations
            memory[name] = max(peaks.values()) * size
            messages[name] = sum(a.kind.startswith("send") for actions in schedule.actions
                                 for a in actions)
        assert rates == {"1f1b": Fraction(p - 1, m), "zb1p": Fraction(p - 1, 3 * m),
                         "zb2p": 0, "zbv": 0}
        base = memory["1f1b"]
        assert {name: peak / base for name, peak in memory.items()} == \
            {"1f1b": 1, "zb1p": 1, "zb2p": Fraction(2 * p - 1, p), "zbv": 1}
        assert {name: Fraction(count, messages["1f1b"]) for name, count in messages.items()} == \
            {"1f1b": 1, "zb1p": 1, "zb2p": 1, "zbv": 2}


@pytest.mark.parametrize("pp", [4, 6, 8, 10, 12])
def test_dualpipes_readme_table(pp):
    """DualPipe's comparison, "based on the same number of PP stages": 1F1B
    and ZB1P on PP devices, DualPipeV on PP/2. Bubble (PP-1)(F+B),
    (PP-1)(F+B-2W), (PP/2-1)(F&B+B-3W), B the whole backward; parameters
    per device 1x, 1x, 2x; activations per device PP, PP, PP + 1 (a stage's
    of one micro-batch); devices PP, PP, PP/2. Every stage costs the same:
    F = B_input, W <= F, as the conditions above ask."""
    for F, B_input, W in [(1, 1, 1), (2, 2, 1), (2, 2, Fraction(3, 2))]:
        F, B_input, W = Fraction(F), Fraction(B_input), Fraction(W)
        B = B_input + W  # DualPipe's B: the whole backward
        for m in (pp, pp + 3, 2 * pp):
            rows = {"1f1b": (one_f_one_b(pp, m), False), "zb1p": (zb_h1(pp, m), True),
                    "dualpipev": (dualpipe_v(pp // 2, m), True)}
            measured = {}
            for name, (schedule, split) in rows.items():
                makespan, _, idles, peaks = _run(schedule, F, B_input, W, split=split)
                stages_each = schedule.total_stages // schedule.stages
                measured[name] = (max(idles), stages_each, max(peaks.values()),
                                  schedule.stages)
            assert measured == {
                "1f1b": ((pp - 1) * (F + B), 1, pp, pp),
                "zb1p": ((pp - 1) * (F + B - 2 * W), 1, pp, pp),
                "dualpipev": ((pp // 2 - 1) * ((F + B) + B - 3 * W), 2, pp + 1, pp // 2)}, \
                (F, B_input, W, m)
