"""A lesson run as a script tells its story: its Markdown cells are printed,
rendered for a terminal, between the outputs of its code cells.

A lesson is a Jupytext "percent" file: ``# %% [markdown]`` cells of prose and
``# %%`` cells of code. A notebook shows both; ``python lessons/01_...py``
used to run the code and print only bare numbers. Its first code cell calls
:func:`narrate`, which, when the file runs as a script, takes over: it prints
the Markdown cells above that point, then runs the rest of the file itself,
one cell after another, printing each Markdown cell as it is reached, and
ends the program when the last cell is done. The code runs in the script's
own namespace, compiled with its real file name and line numbers, so a
traceback points at the lesson's lines as before.

``narrate()`` does nothing (the file runs as plain Python) in a notebook,
under ``MINIDIST_LESSON_QUIET=1`` (``minidist lesson N --quiet``: outputs
only), in every MPI rank but rank 0, or when the file is imported.

Formulas are written in LaTeX for the notebook; :func:`readable_math` turns
them into text a terminal shows (``2\\frac{n-1}{n}N\\beta`` -> ``2 (n-1)/n N
β``).
"""

from __future__ import annotations

import os
import re
import sys

QUIET = "MINIDIST_LESSON_QUIET"

_CELL = re.compile(r"^# %%(.*)$")

#: LaTeX commands and the characters a terminal shows for them.
_SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "eta": "η",
    "theta": "θ", "lambda": "λ", "mu": "μ", "sigma": "σ", "tau": "τ", "psi": "ψ",
    "Sigma": "Σ", "Delta": "Δ", "sum": "Σ", "prod": "Π", "partial": "∂", "nabla": "∇",
    "approx": "≈", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "times": "×", "cdot": "·", "leftarrow": "←", "rightarrow": "→", "to": "→",
    "infty": "∞", "in": "∈", "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊", "rfloor": "⌋",
    "log": "log", "ln": "ln", "max": "max", "min": "min", "sqrt": "√", "pm": "±",
    "quad": "  ", "qquad": "    ", ",": " ", ";": " ", "!": "", " ": " ",
}
_SUPERSCRIPTS = str.maketrans("0123456789+-=()nT*", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿᵀ*")
_SUBSCRIPT_CHARS = "0123456789xijknr"
_SUBSCRIPTS = str.maketrans(_SUBSCRIPT_CHARS, "₀₁₂₃₄₅₆₇₈₉ₓᵢⱼₖₙᵣ")


def _group(text: str, start: int) -> tuple[str, int]:
    """The ``{...}`` group (or single character) at ``start``, and where it ends."""
    if start < len(text) and text[start] == "{":
        depth, index = 0, start
        while index < len(text):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[start + 1:index], index + 1
            index += 1
        return text[start + 1:], len(text)
    command = re.match(r"\\[A-Za-z]+", text[start:])
    if command:  # x_\text{ring}: the command and its argument
        end = start + len(command.group(0))
        if end < len(text) and text[end] == "{":
            end = _group(text, end)[1]
        return text[start:end], end
    return text[start:start + 1], start + 1


def _atom(text: str) -> str:
    """Parenthesise a fraction's part unless it is one symbol or number."""
    text = text.strip()
    return text if re.fullmatch(r"[\w.α-ωΑ-Ω]+", text) else f"({text})"


def readable_math(latex: str) -> str:
    """One LaTeX formula as plain text: Greek letters and operators as
    characters, ``\\frac{a}{b}`` as ``a/b``, ``x^2`` as ``x²``, ``\\text{..}``
    as its words, braces and ``\\left`` / ``\\right`` dropped."""
    out, index = [], 0
    while index < len(latex):
        char = latex[index]
        if char == "\\":
            match = re.match(r"\\([A-Za-z]+|.?)", latex[index:])
            name = match.group(1)
            index += len(match.group(0))
            if name == "frac":
                top, index = _group(latex, index)
                bottom, index = _group(latex, index)
                out.append(f" {_atom(readable_math(top))}/{_atom(readable_math(bottom))} ")
            elif name in ("text", "mathrm", "mathbf", "mathit", "operatorname"):
                words, index = _group(latex, index)
                out.append(words)
            elif name in ("left", "right", "big", "Big", "displaystyle"):
                continue
            elif name == "sqrt":
                inside, index = _group(latex, index)
                out.append(f"√{_atom(readable_math(inside))}")
            else:
                out.append(_SYMBOLS.get(name, name))
        elif char in "^_":
            part, index = _group(latex, index + 1)
            part = readable_math(part)
            if char == "_" and part and all(c in _SUBSCRIPT_CHARS for c in part):
                out.append(part.translate(_SUBSCRIPTS))   # xᵢ, βₓ, aᵢⱼ, log₂
            elif char == "_":
                out.append("_" + part)                    # t_ring, n_1/2, ∇_w
            elif all(c in "0123456789+-=()nT*" for c in part):
                out.append(part.translate(_SUPERSCRIPTS))  # x², bᵀ, w*
            else:
                out.append(f"^({part})")
        elif char in "{}":
            index += 1
        else:
            out.append(char)
            index += 1
    return re.sub(r" {2,}", " ", "".join(out)).strip().replace("( ", "(").replace(" )", ")")


def terminal_markdown(markdown: str) -> str:
    """A Markdown cell with every ``$...$`` / ``$$...$$`` formula made readable
    (a display formula on a line of its own, indented)."""
    markdown = re.sub(r"\$\$(.+?)\$\$",
                      lambda m: f"\n\n    {readable_math(m.group(1))}\n\n", markdown,
                      flags=re.S)
    return re.sub(r"\$(.+?)\$", lambda m: readable_math(m.group(1)), markdown)


def cells(source: str) -> list[tuple[str, int, str]]:
    """The file's cells as (kind, first line number, text): kind "markdown"
    (the text without its ``# ``) or "code"; line numbers count from 1."""
    found, kind, start, lines = [], None, 1, []

    def close():
        if kind is not None:
            text = "\n".join(lines)
            if kind == "markdown":
                text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                                 for line in lines)
            found.append((kind, start, text))

    for number, line in enumerate(source.splitlines(), 1):
        marker = _CELL.match(line)
        if marker:
            close()
            kind = "markdown" if "[markdown]" in marker.group(1) else "code"
            start, lines = number + 1, []
        elif kind is not None:
            lines.append(line)
    close()
    return found


def _should_narrate(frame) -> bool:
    if frame.f_globals.get("__name__") != "__main__":
        return False
    if os.environ.get(QUIET, "") not in ("", "0"):
        return False
    if "ipykernel" in sys.modules or "IPython" in sys.modules and _in_ipython():
        return False
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(name, "0") != "0":
            return False
    return bool(frame.f_globals.get("__file__"))


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def speaks() -> bool:
    """True where a lesson's prose is shown: not under ``--quiet``
    (MINIDIST_LESSON_QUIET=1) and not in an MPI rank other than 0."""
    if os.environ.get(QUIET, "") not in ("", "0"):
        return False
    return all(os.environ.get(name, "0") == "0"
               for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def show_markdown(markdown: str) -> None:
    """Print one piece of Markdown prose rendered for a terminal, formulas as
    readable text: how :func:`narrate` prints a Markdown cell, and how
    :func:`minidist.lesson.say` prints prose written with computed values."""
    _printer()(markdown)


def _printer():
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(highlight=False)

    def show(markdown: str) -> None:
        sys.stdout.flush()
        console.print()
        console.print(Markdown(terminal_markdown(markdown)))
        console.file.flush()

    return show


def narrate() -> None:
    """Called from a lesson's first code cell: when the lesson runs as a
    script, print its Markdown cells between its outputs (see the module's
    docstring); otherwise nothing."""
    caller = sys._getframe(1)
    if not _should_narrate(caller):
        return
    path = caller.f_globals["__file__"]
    with open(path, encoding="utf-8") as file:
        source = file.read()
    lines = source.splitlines()
    here = caller.f_lineno
    show = _printer()
    for kind, start, text in cells(source):
        if kind == "markdown" and start < here:
            show(text)
    # The rest of the calling cell, then every later cell, in order.
    rest = [(kind, start, text) for kind, start, text in cells(source) if start > here]
    first_later = rest[0][1] - 1 if rest else len(lines) + 1
    tail = "\n".join(lines[here:first_later - 1])
    namespace = caller.f_globals
    _run(tail, here + 1, path, namespace)
    for kind, start, text in rest:
        if kind == "markdown":
            show(text)
        else:
            _run(text, start, path, namespace)
    sys.stdout.flush()
    # The lesson has run: end the program here, or the script would go on
    # to run its cells a second time after this call returns.
    raise SystemExit(0)


def _run(code: str, first_line: int, path: str, namespace: dict) -> None:
    if not code.strip():
        return
    # Blank lines in front, so that the compiled code has the file's line numbers.
    exec(compile("\n" * (first_line - 1) + code, path, "exec"), namespace)
