"""Does a picture's legend name every symbol the picture draws?

:func:`unnamed` compares the texts a picture draws in its cells with the
symbols its legend names: each legend entry names one symbol (its text up to
the first ": "; "F3c1, B3c1" names both), and a family of symbols is named once: a lone letter a, b,
k, n or r stands for any number ("Σk" names "Σ2", "Σ3", ...; "grad a:b"
names "grad 3:5"; "n" every number); "F3" (letters and numbers) names
"F0", "F1", ..., "F3c1" names "F0c1"; "10..15" names the numbers 10 to 15.

    from legends import unnamed
    assert unnamed(["0", "Σ2", "A"], ["0: rank 0's data", "Σk: ...", "A: ..."]) == []
"""

from __future__ import annotations

import re

from rich.console import Console
from text_layout import text_problems


def symbol_of(entry: str) -> str:
    """The symbol a legend entry names: its text before the first ": "."""
    return entry.split(": ", 1)[0].strip()


def _names(symbol: str, drawn: str) -> bool:
    if symbol == drawn:
        return True
    pattern = re.sub(r"(?<![A-Za-z])[abknr](?![A-Za-z])", r"\\d+", re.escape(symbol))
    if pattern != re.escape(symbol) and re.fullmatch(pattern, drawn):
        return True
    if re.search(r"[^\W\d_]", symbol) and re.search(r"\d", symbol) and re.fullmatch(
            re.sub(r"\d+", r"\\d+", re.escape(symbol)), drawn):
        return True  # letters and numbers: "F3c1" names "F0c1"
    span = re.fullmatch(r"(\d+)\.\.(\d+)", symbol)
    return bool(span and drawn.isdigit() and int(span.group(1)) <= int(drawn) <= int(span.group(2)))


def unnamed(drawn, entries) -> list[str]:
    """The distinct texts of ``drawn`` that no entry of ``entries`` (legend
    texts "symbol: words", or bare symbols) names, sorted; [] when all are."""
    symbols = [one for entry in entries for one in symbol_of(entry).split(", ")]
    return sorted({text for text in drawn
                   if not any(_names(symbol, text) for symbol in symbols)})


def legend_texts(figure) -> list[str]:
    """Every entry of every legend on ``figure`` (its axes' and its own), as
    one line each (an entry's second line, its colour's words, joined)."""
    legends = [axis.get_legend() for axis in figure.axes] + list(figure.legends)
    return [" ".join(text.get_text().split()) for legend in legends if legend is not None
            for text in legend.get_texts()]


def scene_cells(scene) -> dict[int, list[str]]:
    """rank -> the texts its cells show in a :meth:`viz.animate._Painter.scene`
    (the rank's number when its buffer is one box: cells not tracked)."""
    return {entry["rank"]: [cell[3] for cell in entry["cells"]] if "cells" in entry
            else [str(entry["rank"])] for entry in scene["ranks"]}


def terminal_cells(text: str) -> dict[int, str]:
    """rank -> what the terminal prints between its buffer's bars ("rank 2 │ 0Σ2│")."""
    return {int(rank): cells for rank, cells in re.findall(r"rank +(\d+) │([^│]*)│", text)}


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def terminal_text(replay, index, width=120) -> str:
    from viz.terminal import render_frame

    console = Console(record=True, width=width, color_system=None, file=_Discard())
    console.print(render_frame(replay, index, color=False, width=width))
    return console.export_text()


def check_replay(replay, frames) -> list[str]:
    """What is wrong with the legends of ``replay``'s ``frames`` (GIF, player,
    terminal), their text's layout, and the ranks' names: [] when every
    picture names what it draws and the terminal says the same."""
    from viz import animate
    from viz.terminal import cell_width

    found = []
    painter = animate._Painter(replay)
    panel = animate.player_panel(replay)
    player = [entry["label"] for entry in panel["legend"]]
    for index in frames:
        drawn = scene_cells(painter.scene(index))
        painter.draw(index)
        figure = painter.figure
        gif = legend_texts(figure)
        missing = unnamed([text for texts in drawn.values() for text in texts], gif)
        if missing:
            found.append(f"step {index}: the GIF's legend names none of {missing} ({gif})")
        missing = unnamed([text for texts in drawn.values() for text in texts], player)
        if missing:
            found.append(f"step {index}: the player's legend names none of {missing}")
        found += [f"step {index}: {problem}" for problem in text_problems(figure)]
        terminal = terminal_text(replay, index)
        if replay.initial is not None:
            # The terminal draws each rank's cells with the picture's symbols.
            width = cell_width(replay)
            gap = " " if replay.world_size > 10 else ""
            printed = terminal_cells(terminal)
            for rank, texts in drawn.items():
                expected = gap.join(f"{text:>{width}}" for text in texts)
                if printed.get(rank) != expected:
                    found.append(f"step {index}: the terminal prints rank {rank}'s cells "
                                 f"{printed.get(rank)!r}, the picture {expected!r}")
            legend = " ".join(terminal[terminal.index("cells:"):].split())
            for entry in player:
                # The terminal outlines nothing and draws no arrows' colours in
                # its legend; its ranks are one entry, "0..3".
                symbol, words = entry.split(": ", 1)
                if symbol not in ("outlined", "arrow") and not symbol.startswith("rank ") \
                        and not symbol[0].isdigit() and entry not in legend:
                    found.append(f"the terminal's legend lacks {entry!r}: {legend[:200]}")
        # A rank is "rank r" in both.
        titles = {text.get_text() for axis in figure.axes for text in axis.texts}
        for rank in range(replay.world_size):
            if f"rank {rank}" not in titles:
                found.append(f"step {index}: the picture names no 'rank {rank}'")
            if f"rank {rank:>{len(str(replay.world_size - 1))}} " not in terminal:
                found.append(f"step {index}: the terminal names no 'rank {rank}'")
    return found
