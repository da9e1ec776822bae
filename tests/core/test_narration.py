"""A lesson run as a script prints its Markdown cells, rendered for a
terminal, between the outputs of its code cells (minidist/narration.py);
formulas are readable text, never raw LaTeX; ``--quiet`` prints the outputs
only; a failing cell's traceback points at the lesson's own line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.narration import cells, readable_math, terminal_markdown

ROOT = Path(__file__).resolve().parents[2]

LESSON = '''\
# %% [markdown]
# # Lesson 99: a tiny lesson
#
# The ring sends $2\\frac{n-1}{n}N\\beta$ bytes' worth of time.

# %%
from minidist.lesson import narrate

narrate()
print("OUTPUT ONE")

# %% [markdown]
# ## Second part
#
# * a list item with $\\alpha + n\\beta$

# %%
print("OUTPUT TWO")
value = 41 + 1

# %% [markdown]
# ## Third part

# %%
print("OUTPUT THREE", value)
'''


@pytest.mark.parametrize("latex, text", [
    (r"2\frac{n-1}{n}N\beta", "2 (n-1)/n Nβ"),
    (r"t_\text{ring} = 2(n-1)\,\alpha", "t_ring = 2(n-1) α"),
    (r"L(w, b) = \frac{1}{N}\sum_i (x_i w + b - y_i)^2", "L(w, b) = 1/N Σᵢ (xᵢ w + b - yᵢ)²"),
    (r"\beta_x \approx 2\beta", "βₓ ≈ 2β"),
    (r"w \leftarrow w - \eta\,\nabla_w L", "w ← w - η ∇_w L"),
    (r"y = x\,w^* + b^*", "y = x w* + b*"),
    (r"\lceil \log_2 n \rceil \alpha", "⌈ log₂ n ⌉ α"),
    (r"e^{x+1}", "e^(x+1)"),
])
def test_formulas_become_readable_text(latex, text):
    assert readable_math(latex) == text


def test_no_lesson_formula_keeps_latex_in_the_terminal():
    for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")):
        for kind, _, text in cells(path.read_text()):
            if kind == "markdown":
                shown = terminal_markdown(text)
                assert "\\" not in shown.replace("\\n", ""), (path.name, shown)
                assert "$" not in shown, (path.name, shown)


def _run(tmp_path, source, **env):
    script = tmp_path / "99_tiny.py"
    script.write_text(source)
    environment = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100", **env)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env=environment, cwd=tmp_path)


def test_a_script_prints_its_text_between_its_outputs(tmp_path):
    done = _run(tmp_path, LESSON)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    order = ["Lesson 99: a tiny lesson", "2 (n-1)/n Nβ", "OUTPUT ONE", "Second part",
             "α + nβ", "OUTPUT TWO", "Third part", "OUTPUT THREE 42"]
    positions = [out.index(piece) for piece in order]
    assert positions == sorted(positions), out
    assert out.count("OUTPUT ONE") == 1 and out.count("OUTPUT THREE") == 1, \
        "every cell runs once"
    assert "$" not in out and "\\frac" not in out and "# %%" not in out


def test_quiet_prints_the_outputs_only(tmp_path):
    done = _run(tmp_path, LESSON, MINIDIST_LESSON_QUIET="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OUTPUT", "ONE", "OUTPUT", "TWO", "OUTPUT", "THREE", "42"]


def test_a_failing_cell_points_at_the_lesson_line(tmp_path):
    broken = LESSON.replace('value = 41 + 1', 'value = 1 / 0')
    done = _run(tmp_path, broken)
    assert done.returncode == 1
    line = broken.splitlines().index("value = 1 / 0") + 1
    assert f'99_tiny.py", line {line}' in done.stderr, done.stderr
    assert "ZeroDivisionError" in done.stderr
    assert "OUTPUT THREE" not in done.stdout


def test_minidist_lesson_quiet_and_narrated(tmp_path):
    folder = tmp_path / "lessons"
    folder.mkdir()
    (folder / "01_tiny.py").write_text(LESSON)
    from minidist.lesson import lesson_command

    env = dict(os.environ)
    try:
        os.environ["PYTHONPATH"] = str(ROOT)
        narrated = subprocess.run([sys.executable, "-c",
                                   "import sys; from pathlib import Path; "
                                   "from minidist.lesson import lesson_command; "
                                   f"sys.exit(lesson_command(1, folder=Path({str(folder)!r}), "
                                   "quiet=len(sys.argv) > 1))"],
                                  capture_output=True, text=True, timeout=60, cwd=tmp_path)
        quiet = subprocess.run([sys.executable, "-c",
                                "import sys; from pathlib import Path; "
                                "from minidist.lesson import lesson_command; "
                                f"sys.exit(lesson_command(1, folder=Path({str(folder)!r}), "
                                "quiet=len(sys.argv) > 1))", "quiet"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert lesson_command  # the function the command line calls
    assert "Second part" in narrated.stdout and "OUTPUT TWO" in narrated.stdout
    assert "Second part" not in quiet.stdout and "OUTPUT TWO" in quiet.stdout
