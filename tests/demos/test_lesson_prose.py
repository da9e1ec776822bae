"""What a lesson's prose may say by itself, read from its source without
running it: a number it measured or derived is never typed into a Markdown
cell but glued (``minidist.lesson.glue``) and cited by ``say``, so that it is
the run's own number in the notebook and in the terminal; every value the
prose cites is glued somewhere in the lesson.

A number with a unit of time, a percentage or a ratio ("1.8x") in a static
Markdown cell is taken for a measurement unless the lesson sets it itself
(a simulated link's 5 us, a drop rate of 10 %) or quotes it from a source
it cites by author and title (a paper's published accuracy): those are
listed below, per lesson, with the constant or the source they restate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minidist.narration import cells

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))

#: a number with a unit that a run measures: time, a share, a ratio
MEASURED = re.compile(
    r"(?<![\w.$^])(\d[\d,]*(?:\.\d+)?)\s?(ns|us|µs|μs|ms|s|min|%|x(?!\s*\d)|×(?!\s*\d))(?![\w/])")

#: lesson stem -> the numbers-with-units its static prose may state, because
#: the lesson's own code sets them or a cited source published them (the
#: constant or the source named after each)
GIVEN: dict[str, dict[str, str]] = {
    "09_pipeline": {"1 ms": "simulate_schedule(forward_time=1.0): a unit of the simulator's "
                            "clock is 1 ms (schedules.UNIT_NS)",
                    "2 ms": "simulate_schedule(backward_time=2.0)"},
    "11_conv_parallel": {
        "2x": "Tsunashima, \"分散学習のあれこれ\" (2019): channel-wise model parallelism "
              "on 4 GPUs about 2x slower than one GPU (DCGAN)",
        "3x": "Tsunashima (2019): about 3x slower (VGG-16)",
        "10 %": "Tsunashima (2019): SyncBN about 10 % more time (DCGAN)"},
    "02_messages_and_cost": {
        "690 us": "benchmarks/results/p2p.md, Why: a 1 MiB ping-pong before memcopy.py (440-690 us)",
        "172 us": "benchmarks/results/p2p.md, Why: the same ping-pong after it (137-172 us)",
    },
    "03_collectives": {
        "5 us": "the simulator's alpha=5e-6 in section 4",
    },
    "04_ring_allreduce": {
        "5 us": "the simulator's ALPHA = 5e-6 in section 3",
    },
    "15_hyperparameter_search": {
        "80 %": "the training share digits_split keeps: 1 - VALIDATION_FRACTION (0.2)",
        "20 %": "the validation share digits_split cuts: VALIDATION_FRACTION = 0.2",
    },
    "13_communication_wall": {
        "1 %": "the ratio of top-k and random-k the lesson sets: TopKState(0.01)",
        "2 %": "two ranks' 1 % (TopKState(0.01)) with no index in common",
        "3 %": "three ranks' 1 % (TopKState(0.01)) with no index in common",
    },
    "05_data_parallel": {"20 ms": "COMPUTE = 0.02, the pretend compute of a step"},
    "07_parameter_server": {"20 ms": "straggler=(2, 0.02): worker 2's sleep before each gradient"},
    "08_async_and_stale": {"4 ms": "COMPUTE = 0.004, a worker's pretend compute per gradient",
                           "2 ms": "hogwild_curve(4, 0, 0.002): the slow rank's sleep"},
    "16_transformer_one_process": {
        "46.2 %": "Chowdhery et al., PaLM: Scaling Language Modeling with Pathways (2022)"},
    "19_experts": {"10 us": "plan_inputs.CLUSTER.inter.alpha, the links section 6 simulates"},
}


def static_prose(source: str) -> str:
    """The lesson's Markdown cells without formulas and inline code."""
    text = "\n".join(body for kind, _, body in cells(source) if kind == "markdown")
    text = re.sub(r"\$\$.+?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    return re.sub(r"`[^`\n]*`", " ", text)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_static_prose_states_no_measurement(lesson):
    given = GIVEN.get(lesson.stem, {})
    found = [match.group(0) for match in MEASURED.finditer(static_prose(lesson.read_text()))]
    typed = [claim for claim in found if claim not in given]
    assert not typed, (
        f"{lesson.name}'s Markdown states {typed}: glue the value the run computes "
        "(minidist.lesson.glue) and cite it in say(), or, if the lesson sets it itself, "
        "list it in GIVEN with the constant or the source it restates")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_cited_value_is_glued(lesson):
    source = lesson.read_text()
    cited = set(re.findall(r"\{glue\}`(\w+)`", source))
    glued = set(re.findall(r"""\bglue\(\s*["'](\w+)["']""", source))
    assert cited <= glued, f"{lesson.name} cites values it never glues: {sorted(cited - glued)}"


#: phrases that give a symbol of lessons/NOTATION.md another meaning
OTHER_MEANING = re.compile(r"\b(N (?:ranks|workers|processes|GPUs)|n bytes)\b")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_symbols_keep_their_notation_meaning(lesson):
    """N is a message's bytes and n a group's ranks (lessons/NOTATION.md)."""
    found = OTHER_MEANING.findall(static_prose(lesson.read_text()))
    assert not found, f"{lesson.name} writes {found}: lessons/NOTATION.md has N bytes, n ranks"


def test_the_notation_is_where_the_readme_says():
    assert (ROOT / "lessons" / "NOTATION.md").exists()
    assert "lessons/NOTATION.md" in (ROOT / "README.md").read_text()
