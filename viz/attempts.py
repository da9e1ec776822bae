"""The attempts of an elastic run on a timeline: a dashed line where each restart began.

``minidist run --max-restarts`` writes every attempt into one trace: each
event carries ``attempt`` (0, 1, ...) and the header lists the attempts
(``attempts``: number, world size, start, end, how it ended). A trace of
one attempt, or of before restarts, has neither and draws as it always did.
"""

from __future__ import annotations

ATTEMPT_COLOR = "#C85200"


def attempt_starts(header: dict, events: list[dict]) -> list[tuple[int, int, int | None]]:
    """``(attempt, start ns, world size or None)`` of every attempt, in order:
    from the header's list, else from the events' ``attempt`` fields."""
    listed = header.get("attempts")
    if isinstance(listed, list) and listed:
        return [(entry["attempt"], entry["start"], entry.get("world_size"))
                for entry in listed if isinstance(entry.get("start"), int)]
    firsts: dict[int, int] = {}
    for event in events:
        number = event.get("attempt")
        if isinstance(number, int):
            firsts[number] = min(firsts.get(number, event["start"]), event["start"])
    return [(number, start, None) for number, start in sorted(firsts.items())]


def draws_attempts(header: dict, events: list[dict]) -> bool:
    """True when the trace holds more than one attempt."""
    return len(attempt_starts(header, events)) > 1


def draw_attempt_lines(axis, header: dict, events: list[dict], origin: int, span: int,
                       scale: float) -> int:
    """A dashed vertical line at the start of every attempt after the first,
    labelled with its number and size; returns how many were drawn."""
    drawn = 0
    for number, start, world in attempt_starts(header, events)[1:]:
        if not 0 <= start - origin <= span:
            continue
        x = (start - origin) / scale
        axis.axvline(x, color=ATTEMPT_COLOR, linestyle="--", linewidth=1.2, zorder=5)
        size = f", {world} ranks" if world else ""
        # Inside the axes, just below the top edge: right of the line lies the
        # gap while the new ranks start, and above the axes sits the legend.
        axis.text(x, 0.98, f" attempt {number + 1} (restart {number}{size})", fontsize=8,
                  color=ATTEMPT_COLOR, va="top", ha="left", zorder=5,
                  transform=axis.get_xaxis_transform())
        drawn += 1
    return drawn
