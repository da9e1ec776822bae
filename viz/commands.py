"""What ``minidist viz`` and ``minidist demo COLLECTIVE`` do (the CLI parses, this runs).

``minidist viz TRACE``: the step-through of one collective call of a trace in
the terminal (a trace of ring attention, which has none, replays its K, V
ring: :mod:`viz.ring_attention_replay`), or, with output options, its animation (GIF / HTML), the
timeline of the whole trace (PNG) and the Chrome / Perfetto export. A
pipeline run (its header names a ``schedule``) is drawn as its Gantt chart
instead: ``--timeline`` writes the PNG, no option steps through its time
slots (:mod:`viz.pipeline_chart`); ``--gif`` / ``--html`` still animate its
collective calls, if it has any (pipeline x data parallel); without any,
``--html`` writes its time slots as the browser's player
(:mod:`viz.pipeline_player`) and ``--gif`` says why it cannot and exits
with status 2 (an output option writes what it names or says why it
cannot).

``minidist demo COLLECTIVE [--algorithm A] -n N``: run one call of the
collective on N real processes (shared memory, a small int64 array), or on N
simulated ranks with ``--simulate``, trace it, and show the replay.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile

import numpy as np
from rich.console import Console

from minidist import trace as _trace

#: Demo names that are not spelled like a collective.
ALIASES = {
    "ring-allreduce": ("all_reduce", "ring"),
    "allreduce": ("all_reduce", None),
    "allgather": ("all_gather", None),
    "reducescatter": ("reduce_scatter", None),
    "alltoall": ("all_to_all", None),
}
#: The algorithm a demo shows when none is named: the one each lesson draws first.
DEFAULT_ALGORITHMS = {"all_reduce": "ring", "broadcast": "binomial", "reduce": "binomial",
                      "all_gather": "ring", "reduce_scatter": "ring", "scatter": "binomial",
                      "gather": "binomial", "all_to_all": "pairwise", "barrier": "dissemination"}
ELEMENTS_PER_RANK = 4


class VizError(Exception):
    """A problem the user can fix (named file, call, collective or algorithm)."""


# --------------------------------------------------------------------------- minidist viz


#: The errors minidist.trace.read_jsonl raises on a file that is not a trace.
_NOT_A_TRACE = (ValueError, TypeError, KeyError, AttributeError, json.JSONDecodeError)
#: What every event needs for the replay, the timeline and the Chrome export.
_EVENT_KEYS = (("rank", int), ("kind", str), ("start", (int, float)), ("end", (int, float)))


def _not_a_trace(path, detail: str) -> VizError:
    """'PATH is not a minidist trace: WHY', said once whoever said it first."""
    detail = str(detail)
    prefix = os.fspath(path)
    if detail.startswith(prefix):  # read_jsonl's messages start with the path
        detail = detail[len(prefix):].lstrip(" :,")
    detail = detail.removeprefix("is not a minidist trace:").strip()
    return VizError(f"{path} is not a minidist trace: {detail}")


def _load_trace(path) -> _trace.Trace:
    if not os.path.exists(path):
        raise VizError(f"no trace at {path}: record one with `minidist run --trace {path} ...`, "
                       "`minidist simulate ... --trace` or minidist.launch(..., trace=path)")
    try:
        trace = _trace.read_jsonl(path)
    except OSError as error:
        raise VizError(f"cannot read {path}: {error.strerror or error}") from None
    except _trace.WrongEvent as error:  # a trace, with one impossible event: name its line
        raise VizError(str(error)) from None
    except _NOT_A_TRACE as error:
        if "this minidist reads" in str(error):  # a newer trace: update minidist
            raise VizError(str(error)) from None
        raise _not_a_trace(path, f"{type(error).__name__}: {error}"
                           if isinstance(error, (KeyError, AttributeError, TypeError))
                           else error) from None
    if not isinstance(trace.header, dict):
        raise _not_a_trace(path, "its first line is not a JSON object")
    for number, event in enumerate(trace.events, start=2):
        if not isinstance(event, dict):
            raise _not_a_trace(path, f"event {number - 1} is {type(event).__name__}, "
                                     "not a JSON object")
        for key, kind in _EVENT_KEYS:
            if not isinstance(event.get(key), kind) or isinstance(event.get(key), bool):
                raise _not_a_trace(path, f"event {number - 1} has no valid {key!r} "
                                         f"({event.get(key)!r})")
    missing = _trace.missing_events(trace)
    if missing:
        # Drawn, a cut trace shows calls with empty steps as if the run had done that.
        raise VizError(f"{path} looks truncated: {missing}. Nothing is drawn from it: copy "
                       "the whole file, or record the run again")
    return trace


#: The extensions each output option accepts.
EXTENSIONS = {"--gif": (".gif",), "--html": (".html", ".htm"), "--timeline": (".png",),
              "--chrome": (".json",), "--trace": (".jsonl",)}


def _check_output(option: str, path) -> None:
    """Fail before any work if ``path`` cannot be what ``option`` writes."""
    if path is None:
        return
    path = os.fspath(path)
    wanted = EXTENSIONS[option]
    if not path.lower().endswith(wanted):
        raise VizError(f"{option} {path}: the file name must end in {' or '.join(wanted)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise VizError(f"{option} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise VizError(f"{option} {path}: that is a folder, not a file")


def _check_arguments(*, speed: float, **outputs) -> None:
    """Everything about the display and output options that can be wrong up front."""
    if not (math.isfinite(speed) and speed > 0):
        raise VizError(f"--speed {speed:g}: it is frames a second, so it must be above 0")
    for name, path in outputs.items():
        _check_output(f"--{name}", path)


@contextlib.contextmanager
def _writing(path):
    """Turn an OSError while writing ``path`` into a one-line VizError."""
    try:
        yield
    except OSError as error:
        raise VizError(f"cannot write {error.filename or path}: "
                       f"{error.strerror or error}") from None


def default_call(replays) -> int:
    """The call ``minidist viz`` shows when none is named: the first all_reduce
    of more than one element if the trace has one, else its first all_reduce,
    else its first call. A DDP run starts with the broadcast of rank 0's
    weights, and each step with the all_reduce of one number (the examples
    counted); the gradients' all_reduce is what it is about."""
    all_reduces = [index for index, found in enumerate(replays)
                   if found.collective == "all_reduce"]
    return next((index for index in all_reduces if replays[index].count > 1),
                all_reduces[0] if all_reduces else 0)


def _pick(replays, call: int, path) -> object:
    """Call ``call`` of the trace, counted from 0 (negative: from the end)."""
    if not -len(replays) <= call < len(replays):
        listing = "; ".join(f"{index}: {r.collective} {r.algorithm} ({r.world_size} ranks)"
                            for index, r in enumerate(replays))
        raise VizError(f"{path} has {len(replays)} collective calls, numbered 0 to "
                       f"{len(replays) - 1}; --call {call} is not one of them. Calls: {listing}")
    return replays[call]


def show(path, *, call: int | None = None, play: bool = False, speed: float = 2.0, gif=None, html=None,
         timeline=None, chrome=None, color: bool = True, fps: float = 1.0,
         console: Console | None = None, list_calls: bool = True) -> int:
    """Everything ``minidist viz`` does, on the trace at ``path``."""
    from viz.pipeline_chart import is_pipeline_trace
    from viz.replay import replays as replays_of

    _check_arguments(speed=speed, gif=gif, html=html, timeline=timeline, chrome=chrome)
    console = console or Console(no_color=not color, highlight=False)
    trace = _load_trace(path)
    pipeline = is_pipeline_trace(trace.header)
    if not trace.events and not pipeline:  # a pipeline's header: its chart says what is missing
        raise VizError(f"{path} holds no events, only its header: nothing to draw (the run "
                       "it records sent no message and marked no region), so nothing is "
                       "written")
    replays = replays_of(trace) if (gif or html or not pipeline) else []
    if not replays and not pipeline:
        replays = _ring_attention_replays(trace)
    # A pipeline run without collective calls: --html is its time slots' page.
    pipeline_page = bool(html and pipeline and not replays and not gif)
    if (gif or html) and not pipeline_page:
        # An output option writes what it names or says why it cannot (before
        # any file is written); it never writes something else in its place.
        _check_replayable(replays, path, pipeline, "--gif" if gif else "--html")
    if chrome:
        with _writing(chrome):
            _trace.write_chrome(chrome, trace.events, trace.header)
        console.print(f"Chrome / Perfetto trace written to {chrome} (open it in "
                      "https://ui.perfetto.dev or chrome://tracing)")
    if pipeline_page:
        return _pipeline_page(trace, path, html, console)
    if pipeline and not (gif or html):
        return _show_pipeline(trace, path, play=play, speed=speed, timeline=timeline,
                              chrome=chrome, color=color, console=console)
    wants_replay = bool(gif or html) or not (timeline or chrome)
    if not replays and wants_replay:
        fallback = timeline or f"{os.path.splitext(os.fspath(path))[0]}.timeline.png"
        console.print(f"{path} has no collective calls to replay (its messages carry no "
                      "collective labels, schema version 2), so here is its timeline instead: "
                      f"{fallback}")
        timeline = fallback
        gif = html = None
        wants_replay = False
    if timeline:
        from viz.timeline import save_timeline

        with _writing(timeline):
            save_timeline(trace, timeline)
        console.print(f"timeline written to {timeline}")
    if not wants_replay:
        return 0
    why = ""
    if call is None:
        call = default_call(replays)
        if call:
            why = (f", the first all_reduce of more than one element (calls 0 to {call - 1} "
                   "come before it)" if replays[call].count > 1
                   else f", the first all_reduce (calls 0 to {call - 1} come before it)")
    chosen = _pick(replays, call, path)
    if len(replays) > 1 and list_calls:
        console.print(f"{path}: {len(replays)} collective calls; showing call "
                      f"{call % len(replays)}: "
                      f"{chosen.collective} {chosen.algorithm}{why} (choose with --call K)")
    if gif or html:
        from viz import animate

        if gif:
            with _writing(gif):
                animate.save_gif(chosen, gif, fps=fps)
            console.print(f"animation written to {gif} (steps 0 to {chosen.steps}: "
                          f"{len(chosen.frames)} frames)")
        if html:
            with _writing(html):
                animate.save_html(chosen, html, fps=fps)
            console.print(f"HTML player written to {html} (steps 0 to {chosen.steps}; "
                          "it needs no network)")
        return 0
    from viz import terminal

    if play:
        terminal.play(chosen, console, speed=speed, color=color)
    else:
        terminal.step_through(chosen, console, color=color)
    return 0


def _ring_attention_replays(trace) -> list:
    """A trace of ring attention (context parallelism) holds no collective
    call but its K, V ring: one replay per ring attention call, forward."""
    from viz.ring_attention_replay import ring_attention_calls, ring_attention_replay

    return [ring_attention_replay(trace, call) for call in ring_attention_calls(trace)]


def _check_replayable(replays, path, pipeline: bool, option: str) -> None:
    """--gif and --html animate a collective call: say in one line why there
    is none to animate, and what draws the trace instead."""
    if replays:
        return
    if pipeline:
        raise VizError(f"{option}: {path} is a pipeline run with no collective calls, and "
                       f"{option} animates collective calls; draw its schedule with "
                       f"`minidist viz {path} --timeline gantt.png`, or step through it "
                       f"with `minidist viz {path}`"
                       + (" (in the browser: --html PAGE)" if option == "--gif" else ""))
    raise VizError(f"{option}: {path} has no collective calls to animate (its messages carry "
                   "no collective labels, schema version 2); draw its timeline with "
                   f"`minidist viz {path} --timeline timeline.png`")


def _pipeline_page(trace, path, html, console: Console) -> int:
    """--html of a pipeline run with no collective calls: its batch's time
    slots in the browser's player (:mod:`viz.pipeline_player`)."""
    from viz import pipeline_chart
    from viz.pipeline_player import save_pipeline_player

    try:
        chart = pipeline_chart.pipeline_chart(trace)
    except (ValueError, IndexError) as error:
        raise VizError(f"{path}: its header says it is a pipeline run "
                       f"(schedule={trace.header.get('schedule')}), but {error}") from None
    with _writing(html):
        save_pipeline_player((trace.header, trace.events), html)
    console.print(f"HTML player written to {html} (the batch's {chart.slots} time slots, "
                  "one a step; it needs no network)")
    return 0


def _show_pipeline(trace, path, *, play: bool, speed: float, timeline, chrome, color: bool,
                   console: Console) -> int:
    """A pipeline run (its header names a schedule): the Gantt chart with
    --timeline, else (without --chrome) the step-through, one time slot a frame."""
    from viz import pipeline_chart

    try:
        chart = pipeline_chart.pipeline_chart(trace)
    except (ValueError, IndexError) as error:
        raise VizError(f"{path}: its header says it is a pipeline run "
                       f"(schedule={trace.header.get('schedule')}), but {error}") from None
    if timeline:
        with _writing(timeline):
            pipeline_chart.save_pipeline_gantt(chart, timeline)
        console.print(f"pipeline Gantt chart written to {timeline} "
                      f"({pipeline_chart.bubble_text(chart)})")
    if timeline or chrome:
        return 0
    if play:
        pipeline_chart.play_pipeline(chart, console, speed=speed, color=color)
    else:
        pipeline_chart.step_through_pipeline(chart, console, color=color)
    return 0


def viz_command(args) -> int:
    if args.trace == "layout" and getattr(args, "shape", None) is not None:
        from viz.dtensor_layout import layout_command

        return layout_command(args.shape, args.mesh, args.placements, args.save,
                              color=not args.no_color)
    if args.trace == "layout" and not os.path.exists("layout"):
        print("minidist viz layout: give the tensor's shape, such as `minidist viz layout 5x4 "
              "--mesh 2x2 --placements \"S(0),S(1)\"`", file=sys.stderr)
        return 2
    if getattr(args, "mesh", None) or getattr(args, "placements", None):
        print("minidist viz: --mesh and --placements draw a DTensor's layout: `minidist viz "
              "layout 5x4 --mesh 2x2 --placements \"S(0),S(1)\"`", file=sys.stderr)
        return 2
    if args.trace == "mesh" and getattr(args, "shape", None) is not None:
        from viz.device_mesh import mesh_command

        return mesh_command(args.shape, args.names, args.save, color=not args.no_color)
    if args.trace == "mesh" and not os.path.exists("mesh"):
        print("minidist viz mesh: give the mesh's shape, such as `minidist viz mesh 2x2x2 "
              "--names dp,tp,pp`", file=sys.stderr)
        return 2
    if getattr(args, "shape", None) is not None or getattr(args, "names", None) \
            or getattr(args, "save", None):
        print("minidist viz: SHAPE, --names and --save draw a device mesh: `minidist viz mesh "
              "2x2x2 --names dp,tp,pp [--save mesh.png]`; a trace takes none of them",
              file=sys.stderr)
        return 2
    try:
        return show(args.trace, call=args.call, play=args.play, speed=args.speed, gif=args.gif,
                    html=args.html, timeline=args.timeline, chrome=args.chrome,
                    color=not args.no_color)
    except VizError as error:
        print(f"minidist viz: {error}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- minidist demo


def resolve(name: str, algorithm: str | None) -> tuple[str, str]:
    """(collective, algorithm) for a demo name such as "ring-allreduce" or "broadcast"."""
    from minidist.distributed import ALGORITHMS

    collective, implied = ALIASES.get(name, (name.replace("-", "_"), None))
    if collective not in ALGORITHMS:
        raise VizError(f"no collective called {name!r}; choose one of "
                       f"{', '.join(sorted(ALGORITHMS))} (or ring-allreduce)")
    algorithm = algorithm or implied or DEFAULT_ALGORITHMS.get(collective) \
        or next(iter(ALGORITHMS[collective]))
    if algorithm not in ALGORITHMS[collective]:
        raise VizError(f"{collective} has no algorithm {algorithm!r}; its algorithms are "
                       f"{', '.join(ALGORITHMS[collective])}")
    return collective, algorithm


def _demo_worker(collective: str, algorithm: str, count: int, root: int) -> None:
    import minidist.distributed as dist
    from minidist.distributed.simulator import CALLS

    spec = CALLS[collective]
    # The first call warms up (the ranks start at different moments, the
    # transport maps its buffers); the demo shows the second.
    for _ in range(2):
        arrays = spec.inputs(dist.get_rank(), dist.get_world_size(), count, np.int64, root)
        spec.start(dist.world_group(), arrays, root, algorithm, dist.ReduceOp.SUM).wait()


def _check_world(collective: str, world_size: int, root: int) -> None:
    """A demo needs two ranks at least, and a root that is one of them."""
    from minidist.distributed.simulator import CALLS

    if world_size < 2:
        raise VizError(f"-n {world_size}: a collective needs at least 2 ranks to show anything "
                       "(on one rank there is nobody to send to, so nothing moves); "
                       "try -n 4")
    if collective in CALLS and CALLS[collective].rooted and not 0 <= root < world_size:
        raise VizError(f"--root {root} is not a rank of the {world_size}-rank world "
                       f"(ranks 0 to {world_size - 1})")


def record(collective: str, algorithm: str, world_size: int, path, *, simulate: bool = False,
           root: int = 0, timeout: float = 60.0) -> str:
    """Run one call of ``collective`` on ``world_size`` ranks and write its trace to ``path``.

    Real processes on shared memory (two calls: a warm-up, then the one to
    look at, the trace's last), or the simulator with ``simulate=True`` (one
    call); each rank's array is a few int64 per rank (small numbers, exact sums).
    """
    _check_world(collective, world_size, root)
    count = ELEMENTS_PER_RANK * world_size
    path = os.fspath(path)
    if simulate:
        from minidist.distributed import simulate as simulate_call

        with _writing(path):
            simulate_call(collective, algorithm, world_size=world_size, nbytes=count * 8,
                          dtype=np.int64, root=root, trace=path)
    else:
        import minidist

        with _writing(path):
            minidist.launch(_demo_worker, world_size=world_size, transport="shm",
                            args=(collective, algorithm, count, root), trace=path,
                            timeout=timeout)
    return path


def demo(name: str, *, algorithm: str | None = None, world_size: int = 4,
         simulate: bool = False, trace=None, gif=None, html=None, timeline=None,
         play: bool = False, speed: float = 2.0, color: bool = True, root: int = 0,
         console: Console | None = None) -> int:
    """Everything ``minidist demo COLLECTIVE`` does."""
    console = console or Console(no_color=not color, highlight=False)
    collective, algorithm = resolve(name, algorithm)
    _check_world(collective, world_size, root)
    _check_arguments(speed=speed, trace=trace, gif=gif, html=html, timeline=timeline)
    where = "simulated ranks" if simulate else "processes (shared memory)"
    with tempfile.TemporaryDirectory(prefix="minidist-demo-") as folder:
        path = trace or os.path.join(folder, f"{collective}-{algorithm}.jsonl")
        console.print(f"{collective} with the {algorithm} algorithm on {world_size} {where}; "
                      f"trace: {path if trace else 'a temporary file (--trace FILE keeps it)'}")
        record(collective, algorithm, world_size, path, simulate=simulate, root=root)
        return show(path, call=-1, play=play, speed=speed, gif=gif, html=html,
                    timeline=timeline, color=color, console=console, list_calls=False)


def demo_command(args) -> int:
    try:
        return demo(args.name, algorithm=args.algorithm, world_size=args.nproc,
                    simulate=args.simulate, trace=args.trace, gif=args.gif, html=args.html,
                    timeline=args.timeline, play=args.play, speed=args.speed,
                    color=not args.no_color, root=args.root)
    except VizError as error:
        print(f"minidist demo: {error}", file=sys.stderr)
        return 2
