"""The planner page in a real headless browser: it loads with the network off,
its sliders move the numbers, and every number it shows is the library's.

The page ports :func:`minidist.parallel.mesh.predict_step`,
:func:`~minidist.parallel.mesh.compare_plans` and the pipeline's virtual
clock to JavaScript (``viz/planner_page.js``). Here the port is held to the
Python: the schedules' actions and the clock's times for a grid of (p, m,
v), then memory per rank and a step's time, component by component, and the
fastest plan that fits, for a grid of settings (ZeRO's stages,
recomputation, sequence parallelism, the three schedules, pp > 1, TP across
nodes, plans that do not fit). Equal means equal to 1e-12 of the value:
the port keeps Python's order of operations, so in practice the floats are
the same.

The browser is Debian's Chromium driven by Playwright, as in
``test_html_player_browser.py`` (its fixtures, so the same skip line when
either is absent, and the same failure under MINIDIST_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import math
import os

import pytest
import test_html_player_browser as player_tests

from minidist.parallel.mesh import compare_plans, predict_step, why_not
from minidist.parallel.pipeline import make_schedule, simulate_schedule
from viz.planner_page import (
    MACHINES,
    machine_of,
    memory_limit_of,
    options_of,
    plan_of,
    settings_of,
    shape_of,
    write_page,
)

# The HTML player's fixtures: the same Chromium, the same network refused, the same skip.
browser = player_tests.browser
open_page = player_tests.open_page

MEMORY = ("parameters", "gradients", "optimizer_state", "activations")
TIME = ("compute", "tp_comm", "pp_bubble", "dp_comm", "total")

#: A 0.2 B GPT small enough that every comparison below is quick.
SMALL = {"n_layer": 16, "n_embd": 1024, "n_head": 16, "vocab_size": 50304, "seq_len": 1024,
         "global_batch": 64, "micro_batch": 1}

#: The grid of settings whose numbers the page must share with predict_step.
GRID = [
    {**SMALL, "dp": 2, "tp": 2, "pp": 2},
    {**SMALL, "dp": 4, "tp": 2, "pp": 2, "zero_stage": 1},
    {**SMALL, "dp": 4, "tp": 2, "pp": 2, "zero_stage": 2},
    {**SMALL, "dp": 4, "tp": 2, "pp": 2, "zero_stage": 3},
    {**SMALL, "dp": 2, "tp": 4, "pp": 2, "recompute": "full"},
    {**SMALL, "dp": 2, "tp": 4, "pp": 2, "sequence_parallel": True},
    {**SMALL, "dp": 8, "tp": 4, "pp": 4, "sequence_parallel": True, "recompute": "full",
     "zero_stage": 3},
    {**SMALL, "dp": 2, "tp": 2, "pp": 4, "schedule": "gpipe"},
    {**SMALL, "dp": 2, "tp": 1, "pp": 4, "schedule": "interleaved_1f1b", "virtual_stages": 2},
    # 4 micro-batches on 8 stages: interleaving's padded rounds, and every rank inter-node.
    {**SMALL, "dp": 16, "tp": 1, "pp": 8, "schedule": "interleaved_1f1b", "virtual_stages": 2},
    {**SMALL, "dp": 1, "tp": 8, "pp": 1},
    {**SMALL, "dp": 2, "tp": 2, "pp": 4, "micro_batch": 4, "seq_len": 2048, "global_batch": 128,
     "schedule": "gpipe", "recompute": "full"},
    {**SMALL, "dp": 4, "tp": 4, "pp": 2, "memory_gb": 8},                 # does not fit
    {**SMALL, "dp": 2, "tp": 8, "pp": 2, "node_size": 4, "sequence_parallel": True},  # TP leaves the node
    {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257, "seq_len": 1024,
     "global_batch": 256, "dp": 4, "tp": 1, "pp": 4, "tflops": 990, "intra_gbs": 900,
     "inter_gbs": 50, "memory_gb": 24, "zero_stage": 1},
    {},                                          # the page's start: 6.7 B on 1,024 ranks
]


def _close(page_value, python_value) -> bool:
    return math.isclose(page_value, python_value, rel_tol=1e-12, abs_tol=1e-15)


@pytest.fixture(scope="module")
def page_path(tmp_path_factory):
    return write_page(tmp_path_factory.mktemp("planner") / "plan.html")


def _shown(page) -> dict:
    """The page's numbers, exact (each element's data-value)."""
    return page.evaluate("""() => {
        const read = (id) => Number(document.getElementById(id).dataset.value);
        const out = {};
        for (const n of ["parameters", "gradients", "optimizer_state", "activations", "total"])
            out["memory_" + n] = read("memory-" + n);
        for (const n of ["compute", "tp_comm", "pp_bubble", "dp_comm", "total"])
            out["time_" + n] = read("time-" + n);
        out.fits = document.getElementById("fits").dataset.fits === "true";
        out.best = document.getElementById("best-plan").dataset.plan;
        const row = document.querySelector("#plans tr.best");
        out.highlighted = row ? row.dataset.plan : "";
        out.state = document.querySelector(".planner").dataset.state;
        return out;
    }""")


def _expected(settings: dict) -> tuple:
    full = settings_of(settings)
    step = predict_step(shape_of(full), plan_of(full), machine_of(full))
    ranks = full["dp"] * full["tp"] * full["pp"]
    best = compare_plans(shape_of(full), ranks, machine_of(full), memory_limit_of(full),
                         **options_of(full)).best
    return full, step, ("" if best is None else str(best.plan))


@pytest.mark.timeout(120)
def test_the_page_loads_with_the_network_off(page_path, open_page):
    page = open_page(page_path)
    page.wait_for_selector("#plans tr.best")
    assert page.errors == []
    assert page.refused == [], f"the page asked the network for {page.refused}"
    assert page.requests == [f"file://{os.path.abspath(page_path)}"], page.requests
    shown = _shown(page)
    assert shown["state"] == "predicted" and shown["time_total"] > 0


@pytest.mark.timeout(120)
def test_a_slider_moved_moves_the_numbers_to_the_librarys(page_path, open_page):
    page = open_page(page_path)
    before = _shown(page)
    page.focus("#pp")
    page.keyboard.press("ArrowLeft")            # pp 16 -> 8, as a student's key would move it
    page.wait_for_function("document.querySelector('output[for=\"pp\"]').textContent === '8'")
    after = _shown(page)
    assert after["time_total"] != before["time_total"]
    assert after["memory_total"] != before["memory_total"]
    settings = page.evaluate("planner.readSettings()")
    assert settings["pp"] == 8
    step = predict_step(shape_of(settings), plan_of(settings), machine_of(settings))
    assert _close(after["time_total"], step.total)
    assert _close(after["memory_total"], step.memory_total)
    # "use it" moves the sliders to the fastest plan that fits.
    best = after["best"]
    page.click("#use-best")
    assert page.evaluate("planner.planName(planner.inputsOf(planner.readSettings()).plan)") == best
    assert page.get_attribute("#plans tr.current", "data-plan") == best


@pytest.mark.timeout(180)
def test_every_number_is_predict_steps_on_a_grid(page_path, open_page):
    page = open_page(page_path)
    for settings in GRID:
        full, step, best = _expected(settings)
        page.evaluate("s => planner.set(s)", full)
        shown = _shown(page)
        where = f"{step.plan} of {settings or 'the start'}"
        assert shown["state"] == "predicted", where
        for name in MEMORY:
            assert _close(shown[f"memory_{name}"], step.memory[name]), (where, name)
        assert _close(shown["memory_total"], step.memory_total), where
        for name in TIME:
            assert _close(shown[f"time_{name}"], getattr(step, name)), (where, name)
        assert shown["fits"] == step.fits(memory_limit_of(full)), where
        assert shown["best"] == best and shown["highlighted"] == best, where
    assert page.errors == []


@pytest.mark.timeout(120)
def test_each_machine_preset_moves_the_sliders_and_the_numbers_follow(page_path, open_page):
    # The topology presets (dgx, commodity nodes) among them: their links as
    # `minidist plan --topology` sees them, on the sliders, and the numbers
    # predict_step's for the settings the preset made.
    page = open_page(page_path)
    for name, preset in MACHINES.items():
        page.select_option("#machine-preset", name)
        settings = page.evaluate("planner.readSettings()")
        for key, value in preset.items():
            assert settings[key] == value, (name, key)
        full, step, best = _expected(settings)
        shown = _shown(page)
        assert _close(shown["time_total"], step.total), name
        assert _close(shown["memory_total"], step.memory_total), name
        assert shown["best"] == best, name
    assert page.errors == []


@pytest.mark.timeout(120)
def test_a_plan_that_cannot_split_the_model_says_why_as_python_does(page_path, open_page):
    page = open_page(page_path)
    full = settings_of({**SMALL, "dp": 2, "tp": 32, "pp": 2})
    page.evaluate("s => planner.set(s)", full)
    assert page.get_attribute(".planner", "data-state") == "impossible"
    why = why_not(shape_of(full), plan_of(full))
    assert page.text_content("#why") == f"{plan_of(full)} cannot split this model: {why}"
    assert page.text_content("#time-total") == "-" and page.text_content("#memory-total") == "-"


@pytest.mark.timeout(120)
def test_the_memory_bar_is_red_when_the_rank_does_not_fit(page_path, open_page):
    page = open_page(page_path)
    page.evaluate("s => planner.set(s)", {"memory_gb": 8})
    assert "over" in page.get_attribute("#memory-bar", "class")
    assert page.get_attribute("#fits", "data-fits") == "false"
    page.evaluate("s => planner.set(s)", {"memory_gb": 80})
    assert "over" not in page.get_attribute("#memory-bar", "class")


#: (schedule, p, m, v): the pipeline grid the ported schedules and clock are held to.
PIPELINES = [("1f1b", p, m, 1) for p, m in ((1, 1), (2, 5), (4, 8), (4, 3), (8, 16))] + \
            [("gpipe", p, m, 1) for p, m in ((2, 2), (4, 8), (3, 7))] + \
            [("interleaved_1f1b", p, m, v) for p, m, v in ((2, 4, 2), (4, 8, 2), (4, 6, 3),
                                                           (8, 4, 2), (2, 2, 1))]

_KINDS = {"forward": "F", "backward": "B", "send_activation": "send_act",
          "recv_activation": "recv_act", "send_grad": "send_grad", "recv_grad": "recv_grad",
          "optimizer_step": "step"}


def _clock_span(events) -> tuple[int, int]:
    regions = [event for event in events if event["kind"] == "compute"]
    return min(e["start"] for e in regions), max(e["end"] for e in regions)


@pytest.mark.timeout(120)
def test_the_ported_schedules_and_clock_are_pythons(page_path, open_page):
    """The actions of each schedule, and its span on the clock for costs with and
    without a transfer and a recomputation; with no transfer, 1F1B and GPipe
    take (m + p - 1)(F + B) on both clocks, the closed form."""
    page = open_page(page_path)
    for name, p, m, v in PIPELINES:
        schedule = make_schedule(name, p, m, v)
        python = [[f"{_KINDS[a.kind]}:{a.microbatch}:{a.chunk}" for a in actions]
                  for actions in schedule.actions]
        ported = page.evaluate("([n, p, m, v]) => planner.makeSchedule(n, p, m, v).actions"
                               ".map(r => r.map(planner.describe))", [name, p, m, v])
        assert ported == [[word.replace(":None:", ":null:") for word in rank]
                          for rank in python], (name, p, m, v)
        for forward, backward, transfer, recompute in ((1.0, 2.0, 0.0, False),
                                                       (0.37, 0.81, 0.05, False),
                                                       (0.37, 0.81, 0.0123456, True)):
            events = simulate_schedule(schedule, forward, backward, transfer,
                                       recompute=recompute)
            span = page.evaluate("([n, p, m, v, f, b, t, r]) => { const c = planner.simulate("
                                 "planner.makeSchedule(n, p, m, v), f, b, t, r);"
                                 " return [c.start, c.end]; }",
                                 [name, p, m, v, forward, backward, transfer, recompute])
            assert tuple(span) == _clock_span(events), (name, p, m, v, forward, transfer)
            if name != "interleaved_1f1b" and transfer == 0.0 and not recompute:
                assert span[1] == (m + p - 1) * (1_000_000 + 2_000_000)
