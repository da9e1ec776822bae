"""minidist.lesson_timing: interleaved repeats, the fastest kept, the load
read before and after and said next to the number when the machine is busy."""

from __future__ import annotations

import pytest

from minidist import lesson_timing
from minidist.lesson_timing import Load, timed


def test_variants_take_turns_in_a_rotating_order():
    calls = []
    timed({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
           "c": lambda: calls.append("c")}, repeats=2, warmup=1)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_the_fastest_repeat_is_kept_and_the_slow_ones_do_not_count(monkeypatch):
    clock = iter([0.0, 1.0,   10.0, 10.5,   20.0, 23.0,   30.0, 30.2])  # warm-up, 3 repeats
    monkeypatch.setattr(lesson_timing.time, "perf_counter", lambda: next(clock))
    result = timed(lambda: None, repeats=3, number=2, blas_threads=None)
    assert result.best[""] == pytest.approx(0.1)        # 0.2 s for 2 calls; the 1 s warm-up left out
    assert result.median[""] == pytest.approx(0.25)
    assert result.samples[""] == pytest.approx([0.25, 1.5, 0.1])


def test_a_busy_machine_is_said_next_to_the_number_and_an_idle_one_is_not():
    idle = Load(before=0.8, after=1.2, cores=2)
    assert not idle.busy and idle.note("see the model") == ""
    busy = Load(before=1.5, after=6.3, cores=2)
    assert busy.busy
    assert busy.note("see the model") == (
        "machine busy (load 1.5 -> 6.3 on 2 cores): these times include waiting for a core; "
        "see the model")


def test_the_load_is_read_before_and_after(monkeypatch):
    loads = iter([3.0, 5.0])
    monkeypatch.setattr(lesson_timing, "machine_load", lambda: next(loads))
    result = timed(lambda: None, repeats=1, blas_threads=None)
    assert (result.load.before, result.load.after) == (3.0, 5.0)


def test_nothing_to_time_is_refused():
    with pytest.raises(ValueError, match="at least one function"):
        timed({}, repeats=3)
