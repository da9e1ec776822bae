"""The layer lists a reader meets, in docs/ARCHITECTURE.md and the README,
say what tests/test_layers.py holds: every module of its LAYERS at its level,
and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
_TOKEN = re.compile(r"(?<![\w`/.-])((?:minidist/|viz/)?[a-z_]+(?:/[a-z_]+)*(?:\.py|/))(?=\s|$|,)")


def _module(token: str) -> str | None:
    """``minidist/parallel/`` -> ``minidist.parallel``; ``units.py`` (a bare
    name, inside minidist/) -> ``minidist.units``; None if no such file."""
    path = token if token.startswith(("minidist/", "viz/")) else "minidist/" + token
    if not (ROOT / path).exists():
        return None
    return path.removesuffix("/").removesuffix(".py").replace("/", ".")


def _block(text: str, heading: str) -> list[str]:
    section = text.split(heading, 1)[1]
    return section.split("```", 2)[1].splitlines()


def _expected() -> dict[str, int]:
    return {prefix: level for level, prefix in LAYERS if prefix != "minidist"}


def test_architecture_draws_every_layer_at_its_level():
    lines = _block((ROOT / "docs" / "ARCHITECTURE.md").read_text(), "## The layers, bottom to top")
    drawn, level = {}, None
    for line in lines:
        found = re.match(r"\s*level (\d+)", line)
        if found:
            level = int(found.group(1))
            line = line[found.end():]
        description = re.split(r"\s{3,}", line.strip(), maxsplit=1)[0]  # the names' column
        for token in _TOKEN.findall(description):
            module = _module(token)
            if module is not None:
                drawn[module] = level
    assert drawn == _expected()


def test_the_readme_names_every_layer_top_down():
    lines = _block((ROOT / "README.md").read_text(), "## The layers of the code")
    named = []
    for line in lines:
        if not line.startswith(("minidist/", "viz/")):
            continue  # lessons/, examples/ ... on top: not minidist's modules
        names = re.split(r"\s{3,}", line.strip(), maxsplit=1)[0]  # the names column
        for token in _TOKEN.findall(names):
            module = _module(token)
            if module is not None and module != "minidist":
                named.append(module)
    expected = _expected()
    assert set(named) == set(expected), set(named) ^ set(expected)
    levels = [expected[module] for module in named]
    assert levels == sorted(levels, reverse=True), list(zip(named, levels))
