"""A lesson's computed values in its prose (minidist.lesson.glue / say) and
its pictures shown where the text points (show_figure / show_file)."""

from __future__ import annotations

import json

import pytest

from minidist import lesson


@pytest.fixture(autouse=True)
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDIST_LESSON_OUTPUT", str(tmp_path))
    monkeypatch.delenv("MINIDIST_LESSON_QUIET", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lesson, "_GLUED", {})
    return tmp_path


def test_a_value_is_formatted_once_and_kept(out):
    assert lesson.glue("ring_ms", 26.4321, "{:.1f} ms") == "26.4 ms"
    assert lesson.glue("share", 0.5712, ".0%") == "57%"
    record = json.loads((out / "glued.json").read_text())
    assert record["ring_ms"] == {"value": 26.4321, "text": "26.4 ms"}
    assert lesson.fill("ring {glue}`ring_ms`, $2N\\beta$, {glue}`share`") == \
        "ring 26.4 ms, $2N\\beta$, 57%"


def test_a_dict_is_kept_as_a_dict_with_text_keys(out):
    """A check may read a glued table: its keys come back as text, as JSON keeps them."""
    lesson.glue("crossed", {1: {"rows": [22, 22], "share": 0.55}}, "{}")
    record = json.loads((out / "glued.json").read_text())
    assert record["crossed"]["value"] == {"1": {"rows": [22, 22], "share": 0.55}}


def test_prose_citing_an_unglued_value_is_refused():
    lesson.glue("known", 1, "d")
    with pytest.raises(KeyError, match="no value is glued as 'unknown'.*glued so far: known"):
        lesson.say("it took {glue}`unknown`")
    with pytest.raises(ValueError, match="not an identifier"):
        lesson.glue("two words", 1)


def test_say_prints_the_filled_prose_and_is_silent_when_quiet(capsys, monkeypatch):
    lesson.glue("busiest", 0.57, ".2f")
    lesson.say("""
        The busiest expert took **{glue}`busiest`** of the tokens, against $1/E$.
    """)
    shown = capsys.readouterr().out
    assert "The busiest expert took 0.57 of the tokens, against 1/E." in shown
    monkeypatch.setenv("MINIDIST_LESSON_QUIET", "1")
    lesson.say("The busiest expert took {glue}`busiest`.")
    assert capsys.readouterr().out == ""


def test_a_figure_is_saved_closed_and_named(out, capsys):
    lesson.use_headless_matplotlib()
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    axis.plot([0, 1])
    lesson.show_figure(figure, "line.png", caption="a line")
    assert (out / "line.png").stat().st_size > 0
    assert not plt.fignum_exists(figure.number)
    assert capsys.readouterr().out.strip() == "[picture: line.png] a line"


def test_a_script_that_imported_ipykernel_still_prints(capsys):
    """Importing ipykernel (as a test or a tool may) does not make a script a
    notebook: the prose is printed, not handed to a display that is not there."""
    pytest.importorskip("ipykernel")
    import ipykernel  # noqa: F401

    assert not lesson.in_notebook()
    lesson.glue("share", 0.5, ".0%")
    lesson.say("half: {glue}`share`")
    assert "half: 50%" in capsys.readouterr().out
