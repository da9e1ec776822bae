"""``minidist exercise``: list the exercises, read one, start it, check a solution.

    minidist exercise list
    minidist exercise show ring_allreduce             # the statement, as start writes it
    minidist exercise start ring_allreduce            # writes ./ring_allreduce.py
    minidist exercise check ring_allreduce            # checks ./ring_allreduce.py
    minidist exercise check ring_allreduce my.py --step   # step through the replay

A failing collective writes the side-by-side replay (the student's run
beside the reference's, the first differing step marked) as
``NAME.replay.gif`` and ``NAME.replay.html`` next to the solution and
prints the marked step; a pipeline schedule writes the two Gantt charts,
``NAME.gantt.png``. Sits on top of :mod:`minidist.exercises` (the checkers)
and :mod:`viz` (the drawings), like the rest of the command line.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def add_parser(sub) -> None:
    """The ``exercise`` verb and its four subcommands, on ``sub``."""
    exercise = sub.add_parser(
        "exercise", help="write a collective or a schedule yourself and have it checked",
        description="Exercises: fill in a function, then check it against the reference on "
                    "real processes and the simulator.")
    verbs = exercise.add_subparsers(dest="verb", metavar="VERB")
    listing = verbs.add_parser("list", help="the exercises and the lesson of each")
    listing.set_defaults(handler=list_command)
    show = verbs.add_parser("show", help="print an exercise's statement (its skeleton)")
    show.add_argument("name")
    show.set_defaults(handler=show_command)
    start = verbs.add_parser("start", help="copy an exercise's skeleton into a folder")
    start.add_argument("name")
    start.add_argument("--dir", default=".", help="where to write NAME.py (default: here)")
    start.add_argument("--force", action="store_true", help="overwrite an existing file")
    start.set_defaults(handler=start_command)
    check = verbs.add_parser("check", help="check your solution against the reference")
    check.add_argument("name")
    check.add_argument("file", nargs="?", help="your solution (default: ./NAME.py)")
    check.add_argument("--out", default=None,
                       help="folder for the replay / Gantt files (default: next to FILE)")
    check.add_argument("--no-processes", action="store_true",
                       help="the simulator only: skip the real processes")
    check.add_argument("--step", action="store_true",
                       help="step through the side-by-side replay with the keys")
    check.add_argument("--no-files", action="store_true", help="write no GIF/HTML/PNG")
    check.set_defaults(handler=check_command)
    exercise.set_defaults(handler=lambda args: (exercise.print_help(), 0)[1])


def _console():
    from rich.console import Console

    return Console()


def list_command(args) -> int:
    from rich.table import Table

    from minidist.exercises import all_exercises

    exercises = all_exercises()
    table = Table(title="minidist exercises")
    # The name is what the student types: never cut, whatever the width (the
    # summary wraps instead); the lesson by its number, as `minidist lesson N`
    # takes it, so that no path is cut at 80 columns.
    table.add_column("name", no_wrap=True, overflow="fold",
                     min_width=max(len(exercise.name) for exercise in exercises))
    table.add_column("write", overflow="fold")
    table.add_column("taught in", no_wrap=True, overflow="fold")
    for exercise in exercises:
        table.add_row(exercise.name, exercise.summary, _lesson_words(exercise.lesson))
    console = _console()
    console.print(table)
    console.print("start one: minidist exercise start NAME; check it: "
                  "minidist exercise check NAME; read its lesson: minidist lesson N")
    return 0


def _lesson_words(path: str) -> str:
    """"lessons/04_ring_allreduce.py" as "lesson 4"; any other path as it is."""
    stem = Path(path).name
    number = stem.split("_", 1)[0]
    return f"lesson {int(number)}" if number.isdigit() else path


def _exercise(name):
    from minidist.exercises import get

    try:
        return get(name)
    except KeyError as error:
        print(f"minidist exercise: {error.args[0]}", file=sys.stderr)
        return None


def show_command(args) -> int:
    """The skeleton as ``start`` would write it: the statement a student
    reads, the function to fill in, its contract and what to reach."""
    exercise = _exercise(args.name)
    if exercise is None:
        return 2
    import textwrap

    print(exercise.skeleton.read_text(), end="")
    print()
    print(textwrap.fill(f"{exercise.name}: {exercise.summary}", 79, initial_indent="# ",
                        subsequent_indent="# "))
    print(f"# taught in {_lesson_words(exercise.lesson)}")
    print(f"# start it: minidist exercise start {exercise.name}")
    print(f"# check it: minidist exercise check {exercise.name}")
    return 0


def start_command(args) -> int:
    exercise = _exercise(args.name)
    if exercise is None:
        return 2
    target = Path(args.dir) / f"{exercise.name}.py"
    if target.exists() and not args.force:
        print(f"minidist exercise: {target} already exists; check it with `minidist exercise "
              f"check {exercise.name} {target}`, or pass --force to start over",
              file=sys.stderr)
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exercise.skeleton, target)
    print(f"wrote {target}: fill in {exercise.function}(), then run "
          f"`minidist exercise check {exercise.name}"
          + (f" {target}`" if Path(args.dir) != Path(".") else "`"))
    return 0


def check_command(args) -> int:
    """Check the solution in a supervised child process (see
    :mod:`minidist.exercises.supervised`): status 0 only for a verified pass;
    a check that gave no verdict is one line on stderr and status 1 or 2."""
    from minidist.exercises.supervised import Stopped, run_check

    exercise = _exercise(args.name)
    if exercise is None:
        return 2
    path = Path(args.file or f"{exercise.name}.py")
    result = run_check(exercise, path, processes=not args.no_processes)
    if isinstance(result, Stopped):
        print(f"minidist exercise: {result.reason}", file=sys.stderr)
        return result.status
    console = _console()
    from rich.markup import escape

    for line in result.passed:
        console.print(f"[green]ok[/green]   {escape(line)}", highlight=False)
    if result.ok:
        console.print(f"[bold green]{exercise.name}: passed[/bold green]")
        return 0
    console.print(f"[bold red]FAIL[/bold red] ({result.failure.kind}) "
                  f"{escape(result.failure.message)}", highlight=False)
    out = Path(args.out) if args.out else path.resolve().parent
    if result.replay is not None:
        _show_replay(result, exercise.name, out, args, console)
    if result.schedules is not None and not args.no_files:
        from viz.pipeline_chart import draw_schedule_comparison

        out.mkdir(parents=True, exist_ok=True)
        written = draw_schedule_comparison(_named_charts(result.schedules),
                                           out / f"{exercise.name}.gantt.png")
        console.print(f"your schedule's Gantt chart above the reference's: {written}")
    return 1


def _named_charts(schedules: dict) -> dict:
    """Each schedule's chart titled by its key ("yours", "ZB-H1 (reference)"),
    its expected bubble the formula of the schedule its header names (a
    student's zb_h1 is measured against ZB-H1's, not 1F1B's)."""
    from dataclasses import replace

    from viz.pipeline_chart import pipeline_chart

    charts = {}
    for name, trace in schedules.items():
        named = isinstance(trace, tuple) and trace[0].get("schedule")
        chart = pipeline_chart(trace) if named else pipeline_chart(trace, schedule=name)
        charts[name] = replace(chart, schedule=name)
    return charts


def _show_replay(result, name, out, args, console) -> None:
    from viz.exercise_replay import (
        render_pair,
        save_side_by_side,
        side_by_side,
        step_through_side_by_side,
    )

    data = result.replay
    model = side_by_side(data["student"], data["reference"], data["first_difference"],
                         data["difference"] or "")
    console.print(f"replay of {data['world_size']} ranks, {data['count']} elements: your run "
                  "(left) beside the reference (right)")
    if not args.no_files:
        out.mkdir(parents=True, exist_ok=True)
        gif, page = save_side_by_side(model, out / f"{name}.replay.gif",
                                      out / f"{name}.replay.html")
        console.print(f"replay written: {gif} (GIF) and {page} (open in a browser)",
                      highlight=False, soft_wrap=True)
    if args.step:
        step_through_side_by_side(model, console)
    elif model.marked is not None:
        console.print(render_pair(model, model.marked, width=min(console.width, 200)))


__all__ = ["add_parser", "check_command", "list_command", "show_command", "start_command"]
