"""The ``minidist`` command.

Each subcommand is a thin layer over the library: it parses arguments and calls
one function, imported only when that subcommand runs so ``minidist --help``
stays instant. This is the one module allowed to import both ``minidist`` and
``viz`` (see the README's layering rules).
"""

from __future__ import annotations

import argparse
import sys


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line (what was
    wrong, and where to read more) and exit status 2, never a usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


# The options of `minidist train` that only one family of models takes.
_GPT_ONLY = ("steps", "layers", "heads", "width", "context", "eval_every", "sample_chars")


def _cmd_train(args) -> int:
    if args.model == "gpt":
        if args.epochs is not None:
            return _train_mistake("--epochs is for the digits models (mlp, cnn); a GPT trains for --steps")
        from minidist.train_gpt import train_gpt

        try:
            train_gpt(steps=args.steps, n_layer=args.layers, n_head=args.heads, n_embd=args.width,
                      block_size=args.context, batch_size=args.batch_size, lr=args.lr,
                      eval_every=args.eval_every, seed=args.seed,
                      sample_chars=args.sample_chars,
                      progress=not args.no_progress)
        except ValueError as error:  # e.g. a width that the heads do not divide
            return _train_mistake(str(error))
        return 0
    given = [name for name in _GPT_ONLY if getattr(args, name) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        return _train_mistake(f"{flag} is for --model gpt; the digits models ({args.model}) train for --epochs")
    from minidist.train import train_digits

    train_digits(
        model=args.model,
        epochs=args.epochs,
        batch_size=64 if args.batch_size is None else args.batch_size,
        lr=args.lr,
        seed=args.seed,
        progress=not args.no_progress,
    )
    return 0


def _train_mistake(message: str) -> int:
    print(f"minidist train: error: {message} (see `minidist train --help`)", file=sys.stderr)
    return 2


# Demos of a parallel strategy: NAME -> the module (in viz/, which may run
# minidist and draw what ran) whose ``main(args) -> int`` trains and shows it.
STRATEGY_DEMOS: dict[str, str] = {"data-parallel": "viz.demo_data_parallel",
                                  "parameter-server": "viz.demo_parameter_server",
                                  "pipeline": "viz.demo_pipeline",
                                  "model-parallel": "viz.demo_model_parallel",
                                  "memory": "viz.demo_memory"}
#: -n when none is given: 4, except for these demos.
DEMO_NPROC: dict[str, int] = {"model-parallel": 2, "memory": 2}
#: The output options each demo writes (a collective's demo: the first entry;
#: the tour, no name: none). Any other is refused, never ignored.
DEMO_OUTPUTS: dict[str | None, tuple[str, ...]] = {
    "collective": ("gif", "html", "timeline"), None: (),
    "data-parallel": ("timeline",), "parameter-server": ("timeline",),
    "pipeline": ("timeline",), "model-parallel": ("timeline",), "memory": ("plot",)}


def _unwritten_output(args) -> str | None:
    """One line on an output option this demo does not write (None: all fine)."""
    kind = args.name if args.name in STRATEGY_DEMOS or args.name is None else "collective"
    writes = DEMO_OUTPUTS[kind]
    for option in ("gif", "html", "timeline", "plot"):
        if getattr(args, option, None) and option not in writes:
            what = f"`minidist demo {args.name}`" if args.name else "the tour (`minidist demo`)"
            offers = (f"it writes {', '.join('--' + name for name in writes)}" if writes
                      else "it writes no file")
            players = ("; the GIF and HTML players animate one collective call, e.g. "
                       f"`minidist demo ring-allreduce --{option} OUT.{option}`"
                       if option in ("gif", "html") else "")
            return f"--{option}: {what} has no such output ({offers}){players}"
    return None


def _cmd_demo(args) -> int:
    if args.nproc is None:
        args.nproc = DEMO_NPROC.get(args.name, 4)
    refused = _unwritten_output(args)
    if refused:
        print(f"minidist demo: {refused}", file=sys.stderr)
        return 2
    if args.name in STRATEGY_DEMOS:
        import importlib

        return importlib.import_module(STRATEGY_DEMOS[args.name]).main(args)
    if args.name is not None:
        from viz.commands import demo_command

        return demo_command(args)
    return _tour(args)


def _tour(args) -> int:
    """The main demo (``make demo``): a short tour of what minidist does.

    1. train a small network on the bundled digits (one process);
    2. four real processes add up their arrays with a ring all_reduce, replayed
       step by step from its trace;
    3. the same algorithms on a simulated cluster of 256 ranks, against the
       cost model.
    """
    from rich.console import Console
    from rich.rule import Rule
    from rich.table import Table

    from minidist.alpha_beta import PARAMS
    from minidist.distributed import simulate
    from minidist.model_gap import RunFacts, explain
    from minidist.train import train_digits
    from viz.commands import demo as replay_demo

    if args.epochs < 1:
        print(f"minidist demo: error: --epochs must be at least 1, got {args.epochs}",
              file=sys.stderr)
        return 2
    console = Console(highlight=False)
    console.print(Rule("1. training on the bundled handwritten digits (one process)"))
    train_digits(model="mlp", epochs=args.epochs, batch_size=64, lr=0.1, seed=0, progress=True)

    console.print(Rule("2. a ring all_reduce on 4 processes, replayed from its trace"))
    console.print("Each rank starts with its own array; after 2(n-1) steps every rank holds "
                  "the sum. A cell shows how many ranks' data it holds (A: all).")
    replay_demo("ring-allreduce", world_size=4, play=True, speed=3.0, console=console)
    if console.is_terminal:
        console.print("The frames played in place, one per step, and stopped on the last.")
    else:
        console.print("Shown: the replay's last frame (in a terminal every frame plays in place, "
                      "one per step).")
    console.print("To step through the frames with the keys: `minidist demo ring-allreduce -n 4`.")
    console.print()

    console.print(Rule("3. the same algorithms on 256 simulated ranks"))
    n, nbytes, sim = 256, 100_000_000, PARAMS["sim"]
    table = Table(title=f"all_reduce of {nbytes / 1e6:.0f} MB: α = {sim.alpha * 1e6:.0f} us, "
                        f"β = 1 / {sim.bandwidth / 1e9:.0f} GB/s (links), "
                        f"γ = 1 / {1 / sim.gamma / 1e9:.0f} GB/s (adding)")
    algorithms = ("ring", "rabenseifner", "reduce_broadcast", "recursive_doubling")
    table.add_column("algorithm", no_wrap=True, min_width=max(map(len, algorithms)))
    for column in ("simulated", "cost model", "messages", "sim / model"):
        table.add_column(column, justify="right")
    gaps = []
    ring = None
    for algorithm in algorithms:
        result = simulate("all_reduce", algorithm, world_size=n, nbytes=nbytes)
        ring = result if algorithm == "ring" else ring
        why = explain(result.time, result.predicted, RunFacts(n, simulated=True))
        table.add_row(algorithm, f"{result.time * 1e3:.1f} ms",
                      f"{result.predicted * 1e3:.1f} ms", f"{result.messages:,}",
                      why.split(":")[0])
        if not why.endswith("the model holds here"):
            gaps.append(f"{algorithm}: {why}")
    console.print(table)
    for line in gaps:
        console.print(line)
    # Where the ring's time goes: its three terms, which the simulator charges.
    latency = 2 * (n - 1) * sim.alpha
    sending = 2 * (n - 1) / n * nbytes * sim.beta
    adding = (n - 1) / n * nbytes * sim.gamma
    console.print(
        f"Where the ring's {ring.time * 1e3:.1f} ms goes (n = {n} ranks, N = {nbytes / 1e6:.0f} MB): "
        f"2(n-1)α = {2 * (n - 1)} messages a rank "
        f"x {sim.alpha * 1e6:.0f} us = {latency * 1e3:.1f} ms of latency; 2(n-1)/n Nβ = "
        f"{sending * 1e3:.1f} ms to send almost twice the {nbytes / 1e6:.0f} MB at "
        f"{sim.bandwidth / 1e9:.0f} GB/s; (n-1)/n Nγ = {adding * 1e3:.1f} ms to add the chunks "
        f"it receives in the reduce-scatter into its own. The bytes alone, 2Nβ = {2 * nbytes * sim.beta * 1e3:.0f} ms, "
        "are the ring's limit only where the additions and latencies are free.")
    console.print("Next: `minidist demo ring-allreduce -n 4` to step through it yourself, "
                  "`minidist demo --help` for every collective and algorithm, "
                  "`minidist simulate all_reduce -n 1024 --size 100MB`, and the lessons in "
                  "lessons/ (python lessons/01_autograd_and_training.py).")
    return 0


def _cmd_viz(args) -> int:
    from viz.commands import viz_command

    return viz_command(args)


def _add_display_arguments(parser) -> None:
    parser.add_argument("--play", action="store_true",
                        help="play the frames without input instead of stepping with keys")
    parser.add_argument("--speed", type=float, default=2.0,
                        help="frames a second with --play (default 2)")
    parser.add_argument("--gif", default=None, metavar="OUT.gif",
                        help="write the animation as a GIF instead of the step-through")
    parser.add_argument("--html", default=None, metavar="OUT.html",
                        help="write a self-contained HTML player instead of the step-through")
    parser.add_argument("--timeline", default=None, metavar="OUT.png",
                        help="write the timeline of the whole trace (one row per rank)")
    parser.add_argument("--no-color", action="store_true",
                        help="no colours: every cell still shows its letter or number")


def _cmd_run(args) -> int:
    if args.max_restarts is not None:
        from minidist.run_elastic import run_elastic

        return run_elastic(args)
    if isinstance(args.nproc, tuple):
        low, high = args.nproc
        print(f"minidist run: error: -n {low}:{high} (a range of sizes) is for elastic runs: "
              f"add --max-restarts K, or give one size, -n {high}", file=sys.stderr)
        return 2
    from minidist.run_script import run_command

    return run_command(args)


def _ranks(text: str):
    """``-n``: N, or MIN:MAX (torchrun's ``--nnodes MIN:MAX``, for --max-restarts)."""
    if ":" not in text:
        return _positive_int(text)
    from minidist.runtime.restarts import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _exit_now(code: int):
    """End this process as an interpreter's exit would, without the teardown.

    After ``minidist run`` the launcher has released everything itself (its
    workers are reaped, its shared memory unlinked, its files closed); what
    Python's exit would still do is free every module one by one (Rich's,
    the runtime's: a visible share of a short `minidist run`, see
    benchmarks/README.md, "Starting workers"), while the command's caller
    waits. So: what an exit does before that (threads, ``atexit``, flushes;
    the same ending a rank gets), and ``os._exit``."""
    import os

    from minidist.runtime.program import finish_interpreter

    os._exit(finish_interpreter(code))


def _cmd_bench(args) -> int:
    if args.kind == "collectives":
        from minidist.bench.collectives import run_from_args

        return run_from_args(args)
    args.bench_parser.print_help()
    return 0


def _cmd_simulate(args) -> int:
    from minidist.commands import simulate_command

    return simulate_command(args)


def _cmd_predict(args) -> int:
    from minidist.commands import predict_command

    return predict_command(args)


def _cmd_plan(args) -> int:
    from minidist.parallel.mesh.plan_command import page_settings, plan_command

    if args.html is None:
        return plan_command(args)
    from viz.planner_page import write_page  # the page is drawn above the planner

    import os

    folder = os.path.dirname(os.path.abspath(args.html))
    if not os.path.isdir(folder):
        raise SystemExit(f"minidist plan: --html {args.html}: the folder {folder} does not "
                         "exist; make it first or give a path in an existing folder")
    path = write_page(args.html, page_settings(args))
    print(f"wrote {path}: the planner page, offline (open it in a browser)")
    return 0


def _cmd_lesson(args) -> int:
    from minidist.lesson import lesson_command

    return lesson_command(args.number, quick=args.quick, quiet=args.quiet)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="minidist",
        description="Learn parallel and distributed training by running it.",
    )
    parser.add_argument("--version", action="version", version="minidist 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser(
        "train", help="train a model on the bundled 8x8 digits, or a GPT on Shakespeare",
        description="Train on one process: an MLP or a CNN on the bundled 8x8 digits (--epochs), "
                    "or a character-level GPT on the bundled Shakespeare (--model gpt, --steps), "
                    "which reports train and validation loss and ends with a sample of its text.")
    train.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
    train.add_argument("--epochs", type=_positive_int, default=None,
                       help="mlp, cnn: default 30 (mlp), 15 (cnn)")
    train.add_argument("--batch-size", type=_positive_int, default=None,
                       help="default: 64 (mlp, cnn), 12 windows (gpt)")
    train.add_argument("--lr", type=_positive_float, default=None,
                       help="default: 0.1 (mlp), 0.05 (cnn), 0.001 (gpt, AdamW)")
    train.add_argument("--seed", type=int, default=0)
    gpt = train.add_argument_group("gpt only (defaults: 2000 steps, 4 layers, 4 heads, width 128, context 64)")
    gpt.add_argument("--steps", type=_positive_int, default=None, help="optimizer steps")
    gpt.add_argument("--layers", type=_positive_int, default=None, help="transformer blocks")
    gpt.add_argument("--heads", type=_positive_int, default=None, help="attention heads (must divide --width)")
    gpt.add_argument("--width", type=_positive_int, default=None, help="n_embd, the model's width")
    gpt.add_argument("--context", type=_positive_int, default=None, help="block_size, the longest context")
    gpt.add_argument("--eval-every", type=_positive_int, default=None,
                     help="measure train and validation loss every N steps (default 200)")
    gpt.add_argument("--sample-chars", type=int, default=None,
                     help="characters of generated text printed at the end (default 300)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=_cmd_train)

    demo = sub.add_parser(
        "demo",
        help="the main demo, or a collective replayed step by step",
        description="Without NAME: train a small network on the bundled digits. With NAME "
                    "(a collective such as broadcast, all_reduce, ..., or ring-allreduce): run "
                    "one call on N processes (shared memory, a small int64 array) or N "
                    "simulated ranks, trace it, and step through what moved.",
    )
    demo.add_argument("name", nargs="?", default=None,
                      help="ring-allreduce, or any collective: broadcast, reduce, all_reduce, "
                           "scatter, gather, all_gather, reduce_scatter, all_to_all, barrier")
    demo.add_argument("--epochs", type=int, default=20, help="training demo: epochs")
    demo.add_argument("--algorithm", default=None, help="the collective's algorithm "
                      "(default: ring where there is one, else binomial, ...)")
    demo.add_argument("-n", "--nproc", type=int, default=None,
                      help="ranks (default 4; model-parallel, memory: 2)")
    demo.add_argument("--simulate", action="store_true",
                      help="run on simulated ranks (any number) instead of processes")
    demo.add_argument("--root", type=int, default=0, help="root of rooted collectives")
    demo.add_argument("--trace", default=None, metavar="FILE",
                      help="keep the trace in FILE (default: a temporary file)")
    strategy = demo.add_argument_group("strategies (data-parallel, parameter-server, "
                                       "pipeline, model-parallel, memory)")
    strategy.add_argument("--servers", type=int, default=1,
                          help="parameter-server: server ranks (the rest are workers)")
    strategy.add_argument("--mode", default="bsp",
                          help="parameter-server: consistency (bsp, async, ssp, drop, ...)")
    strategy.add_argument("--tau", type=int, default=2,
                          help="parameter-server: staleness bound of ssp")
    strategy.add_argument("--schedule", default="1f1b",
                          help="pipeline: gpipe, 1f1b, interleaved, and the zero-bubble "
                               "zb_h1, zb_h2, zbv, dualpipev (dualpipev: m >= 2p)")
    strategy.add_argument("--stages", type=int, default=4, help="pipeline: stages")
    strategy.add_argument("--microbatches", type=int, default=8,
                          help="pipeline: micro-batches per batch")
    strategy.add_argument("--plot", default=None, metavar="OUT.png",
                          help="memory: draw memory per rank over one step, DDP and each "
                               "ZeRO stage side by side")
    _add_display_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)

    viz = sub.add_parser(
        "viz",
        help="replay a trace's collective step by step, animate it, or draw its timeline; "
             "draw a device mesh (viz mesh 2x2x2)",
        description="Step through one collective call of TRACE in the terminal (n/space "
                    "next, b back, g/G start/end, q quit), or write it as a GIF / HTML "
                    "animation; draw the timeline of any trace; export it for Perfetto. "
                    "`minidist viz mesh 2x2x2 --names dp,tp,pp [--save mesh.png]` draws a "
                    "device mesh instead: where each global rank sits, each dimension's groups. "
                    "`minidist viz layout 5x4 --mesh 2x2 --placements \"S(0),S(1)\"` draws a "
                    "DTensor's layout: which rank holds which element.",
    )
    viz.add_argument("trace", help="a trace file (JSON lines) written by minidist, 'mesh' "
                                   "or 'layout'")
    viz.add_argument("shape", nargs="?", default=None,
                     help="with 'mesh': the mesh's shape, such as 2x2x2 (row-major, as "
                          "init_device_mesh lays out the ranks); with 'layout': the 2-D "
                          "tensor's shape, such as 5x4")
    viz.add_argument("--mesh", default=None, metavar="2x2",
                     help="layout: the mesh's shape (default 4)")
    viz.add_argument("--placements", default=None, metavar="\"S(0),R\"",
                     help="layout: one placement per mesh dim: S(d), R or P")
    viz.add_argument("--names", default=None, metavar="A,B,C",
                     help="mesh: the dimensions' names, such as dp,tp,pp")
    viz.add_argument("--save", default=None, metavar="OUT.png",
                     help="mesh, layout: also write the picture as a PNG")
    viz.add_argument("--call", type=int, default=None,
                     help="which collective call of the trace, from 0 (default: the first "
                          "all_reduce, else 0)")
    viz.add_argument("--chrome", default=None, metavar="OUT.json",
                     help="write the trace for chrome://tracing and ui.perfetto.dev")
    _add_display_arguments(viz)
    viz.set_defaults(handler=_cmd_viz)

    run = sub.add_parser(
        "run",
        help="run a script on N worker processes (like torchrun)",
        description="Start N workers running SCRIPT; each calls dist.init_process_group().",
    )
    run.add_argument("-n", "--nproc", type=_ranks, required=True,
                     help="number of worker processes; MIN:MAX with --max-restarts (start on "
                          "MAX, go on with fewer down to MIN when ranks are lost)")
    run.add_argument("--max-restarts", type=_count, default=None, metavar="K",
                     help="restart every rank up to K times after a failure (torchrun's "
                          "--max-restarts); the script resumes from its checkpoint")
    run.add_argument("--transport", default="shm", choices=["shm", "pipe", "mpi"],
                     help="shm, pipe, or mpi (starts the ranks with mpiexec)")
    run.add_argument("--trace", default=None, help="write the trace (JSON lines) to this file")
    run.add_argument("--timeout", type=_positive_float, default=None,
                     help="seconds before a hung run is stopped")
    run.add_argument("script", help="the Python file each rank runs")
    run.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="the script's own arguments (sys.argv[1:] on every rank)")
    run.set_defaults(handler=_cmd_run)

    bench = sub.add_parser(
        "bench",
        help="measure minidist next to MPICH and gloo",
        description="Benchmarks that print tables and write JSON results.",
    )
    bench_kinds = bench.add_subparsers(dest="kind", metavar="KIND")
    collectives = bench_kinds.add_parser(
        "collectives",
        help="every collective algorithm, nccl-tests style, with MPICH, gloo and the cost model",
        description="Time every collective algorithm per size and world size (time, algbw, "
        "busbw), next to MPICH (mpi4py) and torch.distributed gloo when installed, and the "
        "cost model's prediction.",
    )
    from minidist.bench import add_collectives_arguments

    add_collectives_arguments(collectives)
    bench.set_defaults(handler=_cmd_bench, bench_parser=bench)

    simulate = sub.add_parser(
        "simulate",
        help="time a collective on many simulated ranks (virtual alpha-beta clock)",
        description="Run COLLECTIVE's algorithms on N ranks simulated in this process, with "
                    "a clock that charges alpha + bytes/bandwidth per message, and compare "
                    "the simulated time with the cost model's formula.",
    )
    simulate.add_argument("collective",
                          help="broadcast, reduce, all_reduce, scatter, gather, all_gather, "
                               "reduce_scatter, all_to_all or barrier")
    simulate.add_argument("--algorithm", default="all",
                          help="one algorithm, or 'all' (default) to compare them")
    simulate.add_argument("-n", "--nproc", type=int, required=True,
                          help="number of simulated ranks")
    simulate.add_argument("--size", default="100MB",
                          help="N, e.g. 4KB, 100MB, 1GiB (default 100MB): each rank's array, "
                               "or the whole gathered array for scatter, gather and "
                               "all_gather, the input of reduce_scatter, what one rank sends "
                               "in all_to_all")
    simulate.add_argument("--alpha", default=None, help="latency per message (default 5us)")
    simulate.add_argument("--bandwidth", default=None,
                          help="bytes per second of a link (default 10GB/s)")
    simulate.add_argument("--gamma-bandwidth", default=None,
                          help="bytes per second a rank combines in a reduction (default "
                               "10GB/s, or the topology's; inf: combining is free)")
    simulate.add_argument("--topology", default="flat",
                          help="the cluster's shape (default flat: one link for every pair): "
                               "dgx, commodity, dgx:4 (nodes), or "
                               "nodes=4,ranks_per_node=8,intra=300GB/s,inter=25GB/s,nics=1; "
                               "its links replace --alpha and --bandwidth")
    simulate.add_argument("--root", type=int, default=0, help="root rank of rooted collectives")
    simulate.add_argument("--dtype", default="float32", help="element type (default float32)")
    simulate.add_argument("--trace", default=None,
                          help="write the simulated messages to this file (minidist trace)")
    simulate.add_argument("--quiet", action="store_true",
                          help="no progress bar (it is drawn on stderr, on a terminal only)")
    simulate.set_defaults(handler=_cmd_simulate)

    predict = sub.add_parser(
        "predict",
        help="batch inference on N processes (and int8), checked against one process",
        description="Train the digits model, predict the test digits on 1 and on N processes, "
                    "and report throughput and whether the predictions are the same bit for bit.",
    )
    predict.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    predict.add_argument("-n", "--nproc", type=int, default=2, help="worker processes (default 2)")
    predict.add_argument("--batch-size", type=int, default=256, help="examples per batch (default 256)")
    predict.add_argument("--copies", type=int, default=10,
                         help="predict the test digits this many times over (default 10)")
    predict.add_argument("--epochs", type=int, default=None,
                         help="training epochs (default: 30 mlp, 15 cnn)")
    predict.add_argument("--seed", type=int, default=0)
    predict.add_argument("--int8", action="store_true",
                         help="also quantise the model to int8 and predict with it")
    predict.add_argument("--transport", default="shm", choices=["shm", "pipe"])
    predict.add_argument("--no-progress", action="store_true", help="no progress bar")
    predict.set_defaults(handler=_cmd_predict)

    plan = sub.add_parser(
        "plan",
        help="predict a GPT's step on every dp x tp x pp of a budget of ranks",
        description="Predict one training step of a GPT under every dp x tp x pp that "
                    "multiplies to --ranks (tp within a node) from the cost model and the "
                    "pipeline's clock; keep those that fit in --memory, fastest first, and "
                    "show the plan the Ultra-Scale Playbook's order reaches. The defaults: "
                    "a 6.7 B GPT on 1,024 ranks of a GPU cluster (chosen, not measured).",
    )
    plan.add_argument("--ranks", type=_positive_int, default=None,
                      help="ranks (default 1024; with --mesh, the mesh's)")
    plan.add_argument("--mesh", default=None, metavar="DPxTPxPP",
                      help="only this plan's breakdown, e.g. 8x8x16")
    plan.add_argument("--memory", default="80GB", help="memory a rank (default 80GB)")
    plan.add_argument("--html", default=None, metavar="PATH",
                      help="write the planner page instead: one offline HTML file whose "
                           "sliders move these settings (the numbers: the same formulas)")
    for name, default, what in (("n-layer", 32, "layers"), ("n-embd", 4096, "width h"),
                                ("n-head", 32, "heads"), ("vocab", 50304, "vocabulary"),
                                ("seq-len", 4096, "tokens a sequence"),
                                ("global-batch", 1024, "sequences a step"),
                                ("micro-batch", 1, "sequences a micro-batch")):
        plan.add_argument(f"--{name}", type=_positive_int, default=default,
                          help=f"{what} (default {default})")
    plan.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe", "interleaved"])
    plan.add_argument("--virtual-stages", type=_positive_int, default=1,
                      help="chunks a rank with --schedule interleaved (default 1)")
    plan.add_argument("--sequence-parallel", action="store_true",
                      help="Megatron's sequence parallelism on the tp group")
    plan.add_argument("--recompute", action="store_true", help="full activation recomputation")
    plan.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3],
                      help="ZeRO's stage on the dp group (default 0: DDP)")
    plan.add_argument("--tflops", type=_positive_float, default=400.0,
                      help="TFLOP/s a rank sustains (default 400)")
    plan.add_argument("--node-size", type=_positive_int, default=None,
                      help="ranks a node (default 8)")
    plan.add_argument("--intra", default=None, help="bandwidth within a node (default 200GB/s)")
    plan.add_argument("--inter", default=None,
                      help="bandwidth between nodes, a rank (default 25GB/s)")
    plan.add_argument("--topology", default=None,
                      help="the cluster (dgx, commodity, dgx:128, or key=value pairs as "
                           "`minidist simulate --topology`): its node size and links replace "
                           "--node-size, --intra and --inter")
    plan.set_defaults(handler=_cmd_plan)

    lesson = sub.add_parser(
        "lesson",
        help="list the lessons, or run lesson N",
        description="Without N: list the course's lessons (lessons/NN_topic.py). With N: run "
                    "lesson N as a script: its text printed between its outputs.",
    )
    lesson.add_argument("number", nargs="?", type=int, default=None, metavar="N",
                        help="the lesson's number")
    lesson.add_argument("--quick", action="store_true",
                        help="the reduced form of long experiments (as CI runs them)")
    lesson.add_argument("--quiet", action="store_true",
                        help="the outputs only, without the lesson's text between them")
    lesson.set_defaults(handler=_cmd_lesson)

    from minidist.profile_command import add_parser as add_profile_parser

    add_profile_parser(sub)

    from minidist.exercise_command import add_parser as add_exercise_parser

    add_exercise_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, or a mistake already told in one line
        return done.code if isinstance(done.code, int) else 2
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0
    try:
        code = args.handler(args) or 0
        if argv is None and args.handler is _cmd_run:  # the program itself (see _exit_now)
            _exit_now(code)
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as stop:
        from minidist.runtime.signals import Terminated

        if isinstance(stop, Terminated):  # SIGTERM, after the run's clean-up
            print("terminated", file=sys.stderr)
            return stop.code
        if not isinstance(stop.code, str):
            raise
        # A command found a mistake in what it was given (a missing file, a
        # missing tool): one line, as argparse's own, and no traceback.
        print(stop.code, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
