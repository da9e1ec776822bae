"""``minidist profile TRACE``: the profile of a trace, as a table, a line
naming the slowest rank, a picture and a Chrome trace with the numbers.

What :func:`minidist.profile.profile` returns becomes, here, lines on the
terminal and an exit status: 0 when every event was used; 1 when the
numbers are partial (a trace cut short, a failed run's, an older trace
without what pairs its messages), each thing skipped said in one line;
2 when there is nothing to profile (no such file, not a trace, empty), in
one line and no traceback, as every mistake on the command line.
"""

from __future__ import annotations

import os
import sys

from minidist.profile import Breakdown, Profile, ProfileError, profile, write_chrome_with_profile

#: The table's time columns: (heading, what Breakdown.ns is asked).
COLUMNS = (("span", "span"), ("compute", "compute"), ("overlapped", "overlapped"),
           ("exposed", "exposed"), ("idle", "idle"), ("waiting", "waiting"))


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "profile",
        help="where a traced run's time went: compute, overlapped and exposed "
             "communication, idle, per rank",
        description="Profile TRACE (in the spirit of Meta's Holistic Trace Analysis): per rank "
                    "and overall, compute, communication overlapped with it, exposed "
                    "communication, idle time (waiting for a peer, or unmarked), the overlap "
                    "percentage, and the slowest rank with what it waited on. Which moment "
                    "is which: the docstring of minidist/profile/breakdown.py. Exit status 1: "
                    "partial numbers (a cut or failed run's trace), each gap said.",
    )
    parser.add_argument("trace", help="a trace file (JSON lines) written by minidist")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="only rank R's row (and its steps with --steps)")
    parser.add_argument("--steps", action="store_true",
                        help="also a table per training step (where the trace has steps)")
    parser.add_argument("--picture", default=None, metavar="FILE.png",
                        help="write a stacked bar per rank: compute, overlapped, exposed, idle")
    parser.add_argument("--chrome", default=None, metavar="OUT.json",
                        help="write the trace for Perfetto with the profile in its otherData")
    parser.set_defaults(handler=profile_command)


def profile_command(args) -> int:
    from rich.console import Console

    console = Console(highlight=False)
    try:
        found = profile(args.trace)
    except ProfileError as error:
        return _refuse(str(error))
    if args.rank is not None and args.rank not in found.ranks:
        return _refuse(f"rank {args.rank} is not in {args.trace}: its ranks are "
                       f"{', '.join(map(str, sorted(found.ranks)))}")
    for path, flag in ((args.picture, "--picture"), (args.chrome, "--chrome")):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            return _refuse(f"{flag} {path}: the folder {folder} does not exist")
    ranks = sorted(found.ranks) if args.rank is None else [args.rank]
    unit, scale = _unit(found)
    rule = "marked regions" if found.rule == "regions" else "all but communication"
    console.print(f"{args.trace}: where the time went, in {unit} (compute: {rule}; "
                  "overlapped and exposed: communication under compute and not; idle: "
                  "waiting for a peer and unmarked time)")
    console.print(_table(None,
                         [(f"rank {r}", found.ranks[r]) for r in ranks]
                         + ([("all", found.overall)] if args.rank is None else []),
                         scale))
    console.print(slowest_line(found, scale, unit))
    if args.steps:
        _print_steps(console, found, args.rank, scale, unit)
    if len(found.dimensions) > 1 or found.header.get("mesh_shape"):
        console.print(_dimension_table(console, found, ranks, scale, unit))
    for remark in found.remarks:
        console.print(f"note: {remark}")
    if args.picture:
        from viz.profile_bars import save_profile_bars

        save_profile_bars(args.trace, args.picture, found=found, ranks=ranks)
        console.print(f"picture: {args.picture}")
    if args.chrome:
        write_chrome_with_profile(args.trace, args.chrome, found)
        console.print(f"chrome trace (the profile in otherData): {args.chrome}")
    if found.skipped:
        for line in found.skipped:
            console.print(f"skipped: {line}")
        more = f" (and {len(found.skipped) - 1} more above)" if len(found.skipped) > 1 else ""
        print(f"minidist profile: partial numbers: {found.skipped[0]}{more}", file=sys.stderr)
        return 1
    return 0


def _refuse(message: str) -> int:
    print(f"minidist profile: {message}", file=sys.stderr)
    return 2


def _unit(found: Profile) -> tuple[str, float]:
    longest = max((b.ns("span") for b in found.ranks.values()), default=0)
    if longest >= 10e9:
        return "s", 1e9
    return ("ms", 1e6) if longest >= 1e5 else ("us", 1e3)


def _table(title: str | None, rows: list[tuple[str, Breakdown]], scale: float):
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    for heading, _ in COLUMNS:
        table.add_column(heading, justify="right", min_width=len(heading))
    table.add_column("overlap", justify="right", min_width=7)  # overlapped / all communication
    for name, breakdown in rows:
        percent = breakdown.overlap_percent
        table.add_row(name, *(f"{breakdown.ns(key) / scale:,.3f}" for _, key in COLUMNS),
                      "-" if percent is None else f"{percent:.1f}%")
    return table


def slowest_line(found: Profile, scale: float, unit: str) -> str:
    """One line: the slowest rank, for whom and in what it waited most, and
    the rank every rank together waited for most."""
    slow = found.slowest
    if slow is None:
        return "slowest rank: none (no events)"
    line = (f"slowest rank: {slow.rank} ({slow.span_ns / scale:,.3f} {unit} from its first "
            f"event to its last)")
    if slow.peer is None:
        line += "; it never waited for a peer"
    else:
        line += (f"; it waited {slow.waiting_ns / scale:,.3f} {unit}, most for rank {slow.peer} "
                 f"({slow.peer_ns / scale:,.3f} {unit}), most in {slow.what} "
                 f"({slow.what_ns / scale:,.3f} {unit})")
    if slow.most_waited_for is not None:
        line += (f"; the rank waited for most, by all: {slow.most_waited_for} "
                 f"({slow.most_waited_for_ns / scale:,.3f} {unit})")
    return line


def _print_steps(console, found: Profile, rank, scale: float, unit: str) -> None:
    if not found.steps:
        console.print("steps: none found (a step is a pipeline's 'step' region, or the "
                      "recurring label of the lowest rank's first compute region)")
        return
    rows = []
    for step in found.steps:
        if rank is None:
            rows.append((f"step {step.number + 1}", step.overall))
        elif rank in step.ranks:
            rows.append((f"step {step.number + 1}", step.ranks[rank]))
    whose = "all ranks" if rank is None else f"rank {rank}"
    console.print(f"per step, {whose}, in {unit} ({found.step_rule}):")
    console.print(_table(None, rows, scale))


def _dimension_table(console, found: Profile, ranks, scale: float, unit: str):
    from rich import box
    from rich.table import Table

    whose = "all ranks" if len(ranks) > 1 else f"rank {ranks[0]}"
    console.print(f"communication {found.dimension_rule}, in {unit}, {whose}:")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for heading in ("", "calls", "communication", "overlapped", "exposed", "waiting"):
        table.add_column(heading, justify="left" if not heading else "right")
    for name, per_rank in found.dimensions.items():
        mine = [per_rank[r] for r in ranks if r in per_rank]
        if not mine:
            continue
        table.add_row(name, str(sum(d.calls for d in mine)),
                      *(f"{sum(d.ns(key) for d in mine) / scale:,.3f}"
                        for key in ("communication", "overlapped", "exposed", "waiting")))
    return table
