"""The ``minidist`` command.

Each subcommand is a thin layer over the library: it parses arguments and calls
one function, imported only when that subcommand runs so ``minidist --help``
stays instant. This is the one module allowed to import both ``minidist`` and
``viz`` (see the README's layering rules).
"""

from __future__ import annotations

import argparse
import sys


def _cmd_train(args) -> int:
    from minidist.train import train_digits

    train_digits(
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        progress=not args.no_progress,
    )
    return 0


def _cmd_demo(args) -> int:
    # For now the main demo is a short training run on the bundled digits;
    # later chapters turn it into a tour of the distributed demos.
    from minidist.train import train_digits

    train_digits(model="mlp", epochs=args.epochs, batch_size=64, lr=0.1, seed=0, progress=True)
    return 0


def _cmd_run(args) -> int:
    from minidist.distributed.launch import run_command

    return run_command(args)


def _cmd_bench(args) -> int:
    if args.kind == "collectives":
        from minidist.bench.collectives import run_from_args

        return run_from_args(args)
    args.bench_parser.print_help()
    return 0


def _cmd_simulate(args) -> int:
    from minidist.distributed.simulator import simulate_command

    return simulate_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minidist",
        description="Learn parallel and distributed training by running it.",
    )
    parser.add_argument("--version", action="version", version="minidist 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="train a model on the bundled 8x8 digits")
    train.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    train.add_argument("--epochs", type=int, default=None, help="default: 30 (mlp), 15 (cnn)")
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--lr", type=float, default=None, help="default: 0.1 (mlp), 0.05 (cnn)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=_cmd_train)

    demo = sub.add_parser("demo", help="the main demo")
    demo.add_argument("--epochs", type=int, default=20)
    demo.set_defaults(handler=_cmd_demo)

    run = sub.add_parser(
        "run",
        help="run a script on N worker processes (like torchrun)",
        description="Start N workers running SCRIPT; each calls dist.init_process_group().",
    )
    run.add_argument("-n", "--nproc", type=int, required=True, help="number of worker processes")
    run.add_argument("--transport", default="shm", choices=["shm", "pipe"])
    run.add_argument("--trace", default=None, help="write the trace (JSON lines) to this file")
    run.add_argument("--timeout", type=float, default=None, help="seconds before a hung run is stopped")
    run.add_argument("script")
    run.add_argument("script_args", nargs=argparse.REMAINDER)
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
    simulate.add_argument("--alpha", default="5us", help="latency per message (default 5us)")
    simulate.add_argument("--bandwidth", default="10GB/s",
                          help="bytes per second of a link (default 10GB/s)")
    simulate.add_argument("--gamma-bandwidth", default="10GB/s",
                          help="bytes per second a rank combines in a reduction (default "
                               "10GB/s; inf: combining is free)")
    simulate.add_argument("--root", type=int, default=0, help="root rank of rooted collectives")
    simulate.add_argument("--dtype", default="float32", help="element type (default float32)")
    simulate.add_argument("--trace", default=None,
                          help="write the simulated messages to this file (minidist trace)")
    simulate.set_defaults(handler=_cmd_simulate)

    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
