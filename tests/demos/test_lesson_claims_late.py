"""The claims lessons 09-15 state in their text, held where a test can hold
them: on the simulator, on formulas, or with fixed seeds on one process (the
lessons' own measured numbers are theirs to print; the direction each
comparison states is held here). Small and fast: no lesson is run whole."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from minidist import Tensor, memory, nn
from minidist.nn.recompute import CheckpointedSequential, kept_for_backward
from minidist.parallel.data.costs import zero_bytes_per_step, zero_model_state_bytes
from minidist.parallel.pipeline import (
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from minidist.search import random_search
from minidist.search.space import LogUniform, sample_params

# --------------------------------------------------------------- lesson 9


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 1), (4, 8), (4, 32)])
def test_lesson9_the_simulated_bubble_is_the_formula(schedule, p, m):
    events = simulate_schedule(make_schedule(schedule, p, m))
    assert bubble_fraction(events, p) == float(Fraction(p - 1, m + p - 1))


def test_lesson9_more_microbatches_less_bubble():
    bubbles = [bubble_fraction(simulate_schedule(make_schedule("1f1b", 4, m)), 4)
               for m in (1, 2, 4, 8, 16)]
    assert bubbles == sorted(bubbles, reverse=True)


def test_lesson9_1f1b_holds_p_minus_s_microbatches_gpipe_all_m():
    gpipe = peak_live_microbatches(simulate_schedule(make_schedule("gpipe", 4, 8)))
    one_f_one_b = peak_live_microbatches(simulate_schedule(make_schedule("1f1b", 4, 8)))
    assert [gpipe[s] for s in range(4)] == [8, 8, 8, 8]
    assert [one_f_one_b[s] for s in range(4)] == [4, 3, 2, 1]


def test_lesson9_interleaving_cuts_the_bubble_for_more_messages():
    found = []
    for v in (1, 2, 4):
        schedule = make_schedule("interleaved_1f1b" if v > 1 else "1f1b", 4, 8, v)
        events = simulate_schedule(schedule, 1.0 / v, 2.0 / v)
        found.append((bubble_fraction(events, 4), sum(e["kind"] == "send" for e in events)))
        assert found[-1][0] == float(Fraction(3, v * 8 + 3))
    assert [b for b, _ in found] == sorted((b for b, _ in found), reverse=True)
    assert [n for _, n in found] == sorted(n for _, n in found)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_lesson9_a_frame_s_time_is_a_part_of_the_batch(schedule):
    """"slot k of K · time T of E": the optimizer step's slot starts after the
    last backward (the makespan's end), so E is the batch's end, step included;
    no frame's T passes it."""
    import io
    import re

    from rich.console import Console

    from viz.pipeline_chart import pipeline_chart, render_pipeline_frame

    def render_text(frame):
        console = Console(file=io.StringIO(), width=110, color_system=None)
        console.print(frame)
        return console.file.getvalue()

    from minidist import trace

    events = simulate_schedule(make_schedule(schedule, 2, 4), optimizer_time=0.5)
    for event in events:  # a real step starts a little after its rank's last backward
        if trace.label_info(event.get("label") or "").get("pipeline") == "step":
            event["start"] += 100_000
            event["end"] += 100_000
    chart = pipeline_chart(events)
    assert chart.columns[-1].start > chart.makespan and chart.end > chart.makespan
    for index in range(chart.slots):
        text = render_text(render_pipeline_frame(chart, index, color=False))
        unit = {"us": 1e3, "µs": 1e3, "ms": 1e6}
        part, part_unit, whole = re.search(r"time ([\d.]+) (us|µs|ms) of ([\d.]+) ms",
                                           text).groups()
        assert float(part) * unit[part_unit] <= float(whole) * 1e6 == chart.end


# -------------------------------------------------------------- lesson 12


def test_lesson12_sharding_shrinks_model_states_and_stage3_sends_more():
    psi, world = 100_000, 4
    states = [zero_model_state_bytes(psi, world, stage) for stage in range(4)]
    assert states == sorted(states, reverse=True) and states[0] == 16 * psi
    assert states[3] == 16 * psi / world
    ddp = sum(zero_bytes_per_step(psi, world, 0).values())
    stage3 = sum(zero_bytes_per_step([psi // 2, psi // 2], world, 3).values())
    assert stage3 == pytest.approx(1.5 * ddp, rel=0.01)


def test_lesson12_follows_the_notation_and_explains_stage3s_peak():
    """n ranks and 16/n bytes per parameter (lessons/NOTATION.md has N for
    bytes); the peak of stage 3 above stage 2's is explained from the
    measured gathered weights (glued_claims/12_memory_wall.py checks them)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "lessons" / "12_memory_wall.py").read_text()
    assert "16/N" not in text and "8/N" not in text and "N ranks" not in text
    assert "| stage 3 (`FSDP \"FULL_SHARD\"`) | + parameters | 16/n |" in text
    assert "N_d" in text and "Ψ" in text
    for name in ("peak3", "peak2", "peak3_vs_2", "gathered3", "peak3_without"):
        assert f"{{glue}}`{name}`" in text


def _deep_mlp():
    nn.init.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 10))


def test_lesson12_recomputation_keeps_fewer_activations_and_the_same_gradients():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 16)).astype(np.float32), rng.integers(0, 10, 64)
    found = {}
    for name, model in (("plain", _deep_mlp()),
                        ("every=2", CheckpointedSequential(_deep_mlp(), every=2))):
        loss = nn.CrossEntropyLoss()(model(Tensor(x)), y)
        ledger = memory.Ledger(model).sample("forward", graph=loss).bytes["activations"]
        kept = kept_for_backward(loss, exclude=list(model.parameters()))[1]
        loss.backward()
        found[name] = (ledger, kept, [p.grad.copy() for p in model.parameters()])
    assert found["every=2"][0] < found["plain"][0]
    assert found["every=2"][1] < found["plain"][1]
    assert all(np.array_equal(a, b) for a, b in zip(found["plain"][2], found["every=2"][2]))


# -------------------------------------------------------------- lesson 15


def _cheap_objective(trial):
    return -(np.log10(trial.params["lr"]) + 2) ** 2


@pytest.mark.timeout(60)
def test_lesson15_the_same_trials_on_1_and_2_workers():
    space = {"lr": LogUniform(1e-4, 1.0)}
    one = random_search(_cheap_objective, space, 6, n_workers=1, seed=0)
    two = random_search(_cheap_objective, space, 6, n_workers=2, seed=0)
    assert [(t.params, t.value) for t in one.trials] == [(t.params, t.value) for t in two.trials]
    assert sample_params(space, seed=0, number=3) == one.trials[3].params
    assert all(t.state == "complete" for t in two.trials)


def test_lesson15_a_trial_on_its_own_is_the_searchs_trial():
    """Lesson 15's lone trial takes the search's seed for trial 3 (trial_seed(0, 3)),
    so the search gives it the same accuracy; its text names TPE and where the
    constants it asks to change are."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "lessons" / "15_hyperparameter_search.py").read_text()
    assert "Trial(3, params, seed=trial_seed(0, 3), worker=0)" in text
    assert "assert trial_3.value == accuracy" in text
    assert "Tree-structured Parzen Estimator" in text and "Trial k" not in text
    assert "a constant at the top\n# of the lesson's first code cell" in text
    assert "this part is skipped:" not in text



def test_lesson12_names_what_it_asks_the_reader_to_change():
    """Lesson 12 says what `every` is, where WORLDS and CAP are, and tells
    the example count's bytes from the run (no "8 bytes" typed for n ranks)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "lessons" / "12_memory_wall.py").read_text()
    assert "`CheckpointedSequential(model, every=k)` cuts" in text
    assert "(`WORLDS`, the tuple of world sizes" in text and "lower `CAP` (the cap in" in text
    assert "The 8 bytes of\nall_reduce" not in text and "{glue}`count_note`" in text
    assert "load beside the lesson slows all three\nalike" not in text
