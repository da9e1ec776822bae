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
