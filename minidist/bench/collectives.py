"""``minidist bench collectives``: every collective algorithm, timed like nccl-tests,
next to MPICH and gloo and to the cost model's prediction.

    minidist bench collectives                                # everything, a few minutes
    minidist bench collectives --quick                        # a smoke run
    minidist bench collectives --collectives all_reduce --algorithms ring,rabenseifner \\
        --sizes 1MiB-64MiB --world-sizes 2,4 --json all_reduce.json

For each world size and transport, one :func:`minidist.launch` first fits
the cost model's alpha, beta and gamma on ranks 0 and 1
(:func:`minidist.bench.p2p.measure_params`; ``--params`` or ``--no-fit`` to
use given ones), then runs every case (collective x algorithm x size) inside
its workers; each case is timed by
:func:`minidist.bench.timing.time_collective` (warm-up, then blocks of timed
calls after a barrier; the time of a case is the slowest rank's mean in the
fastest block). Then the
same collectives and sizes run on MPICH (mpi4py under mpiexec) and on
torch.distributed's gloo backend, when they are installed
(:mod:`minidist.bench.native`).

Per collective and world size a table shows, for each size and algorithm:
time, algbw and busbw (nccl-tests' definitions, see :mod:`.cases`), the
cost model's prediction (:func:`minidist.costmodel.predict` with the alpha,
beta, gamma fitted in the same launch) and measured / predicted, MPICH's and gloo's
times and minidist's time divided by theirs (below 1: minidist is faster).

The benchmark is written over :data:`minidist.distributed.collectives.call.ALGORITHMS`:
any collective registered there and listed in :data:`CALLS` is measured with
all its algorithms, so a new algorithm or collective needs no change here.

World sizes above the number of cores are *oversubscribed*: ranks take turns
on the cores, so times include the operating system's scheduling. They are
measured and reported, and marked as such.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from minidist import costmodel
from minidist.bench import DEFAULT_SIZES, DEFAULT_WORLD_SIZES, parse_list, parse_sizes
from minidist.bench.cases import ORDER, bus_factor, case_bytes, layout
from minidist.bench.common import KIB, MIB, cores, machine
from minidist.bench.timing import FULL, QUICK, Timing, fastest_block, time_collective
from minidist.model_gap import RunFacts, compare
from minidist.units import format_bytes

#: What --quick measures, unless told otherwise: the collective the targets are
#: about, with every algorithm it has, at the sizes the targets name (4 KiB,
#: 64 MiB; 1 MiB for the model), on the world sizes they name, one short timed
#: timing per case (fastest of 3 blocks), no fit of alpha, beta, gamma (the fit
#: costs seconds per world size; the model target is then not judged), gloo on the
#: first world size only (no target needs it, and starting torch processes is slow).
QUICK_COLLECTIVES = ["all_reduce"]
QUICK_SIZES = [4 * KIB, MIB, 64 * MIB]
QUICK_WORLD_SIZES = [2, 4]

# --------------------------------------------------------------------------- how to call


class Buffers:
    """One rank's arrays for a case: ``whole`` (the size of the case), ``piece``
    (one n-th of it, for gather, scatter, all_gather, reduce_scatter), ``parts``
    (``whole`` cut into n views, for the list forms) and, for all_to_all,
    ``received``. Filled with zeros written out (real pages, not the shared
    zero page), so sums repeated in place never overflow."""

    def __init__(self, collective: str, world_size: int, nbytes: int, rank: int):
        piece_count, whole_count = layout(collective, world_size, nbytes)
        self.root = rank == 0
        self.whole = np.full(whole_count, 0.0, np.float32)
        self.piece = self.whole if piece_count == whole_count else np.full(piece_count, 0.0,
                                                                            np.float32)
        self.parts = (list(np.split(self.whole, world_size))
                      if self.piece is not self.whole and self.whole.size else [])
        self.received = (np.full(whole_count, 0.0, np.float32) if collective == "all_to_all"
                         else None)

    @property
    def received_parts(self):
        return list(np.split(self.received, len(self.parts)))


#: How each collective is called, torch.distributed style: (function name,
#: fn(function, buffers, algorithm) -> a call with no arguments). Where a
#: collective has a single-array form (``all_gather_into_tensor``) it comes
#: first, as nccl-tests times one contiguous buffer; the list form is the
#: fallback. Roots are rank 0.
CALLS = {
    "broadcast": [("broadcast", lambda f, b, a: lambda: f(b.whole, src=0, algorithm=a))],
    "reduce": [("reduce", lambda f, b, a: lambda: f(b.whole, dst=0, algorithm=a))],
    "all_reduce": [("all_reduce", lambda f, b, a: lambda: f(b.whole, algorithm=a))],
    "gather": [("gather", lambda f, b, a: lambda: f(b.piece, b.parts if b.root else None,
                                                     dst=0, algorithm=a))],
    "scatter": [("scatter", lambda f, b, a: lambda: f(b.piece, b.parts if b.root else None,
                                                       src=0, algorithm=a))],
    "all_gather": [
        ("all_gather_into_tensor", lambda f, b, a: lambda: f(b.whole, b.piece, algorithm=a)),
        ("all_gather", lambda f, b, a: lambda: f(b.parts, b.piece, algorithm=a))],
    "reduce_scatter": [
        ("reduce_scatter_tensor", lambda f, b, a: lambda: f(b.piece, b.whole, algorithm=a)),
        ("reduce_scatter", lambda f, b, a: lambda: f(b.piece, b.parts, algorithm=a))],
    "all_to_all": [
        ("all_to_all_single", lambda f, b, a: lambda: f(b.received, b.whole, algorithm=a)),
        ("all_to_all", lambda f, b, a: lambda: f(b.received_parts, b.parts, algorithm=a))],
    "barrier": [("barrier", lambda f, b, a: lambda: f(algorithm=a))],
}


def minidist_function(collective: str):
    """(name, function, builder from :data:`CALLS`) of the public call used for
    ``collective``, or None.
    The collective's own module is looked in first (``dist.barrier`` is the
    point-to-point barrier until a collective one is registered)."""
    import minidist.distributed as dist

    try:
        module = importlib.import_module(f"minidist.distributed.collectives.{collective}")
    except ImportError:
        module = None
    for namespace in (module, dist):
        for name, build in CALLS.get(collective, ()):
            function = getattr(namespace, name, None)
            if callable(function):
                return name, function, build
    return None


def minidist_algorithms() -> dict:
    """{collective: [algorithm names]} of everything minidist can be benchmarked on."""
    from minidist.distributed.collectives.call import ALGORITHMS

    return {collective: list(ALGORITHMS[collective]) for collective in ORDER
            if collective in ALGORITHMS and minidist_function(collective) is not None}


def _sizes_of(collective: str, sizes) -> list[int]:
    return [0] if collective == "barrier" else list(sizes)


def _minidist_worker(cases, timing_fields: dict, fit: dict | None = None):
    """Runs on every rank: fits alpha, beta, gamma when ``fit`` says so
    (:func:`minidist.bench.p2p.measure_params`), then times each (collective,
    algorithm, size) case. Returns (results, the fit or None)."""
    import minidist.distributed as dist
    from minidist.bench import p2p

    timing = Timing(**timing_fields)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    count = np.zeros(1, np.int64)

    def agree(calls: int) -> int:
        count[0] = calls
        dist.broadcast(count, src=0)
        return int(count[0])

    fitted = p2p.measure_params(**fit) if fit else None
    results = []
    for collective, algorithm, nbytes in cases:
        _, function, build = minidist_function(collective)
        buffers = Buffers(collective, world_size, nbytes, rank)
        call = build(function, buffers, algorithm)
        results.append(time_collective(call, nbytes, timing, dist.barrier, agree))
        del call, buffers
    return results, fitted


def measure_minidist(transport: str, world_size: int, cases, timing: Timing,
                     fit: dict | None = None) -> tuple[list, tuple | None]:
    """([(seconds, timed calls per block)] for each case: the slowest rank's
    mean in the fastest block (:func:`~minidist.bench.timing.fastest_block`),
    (Params, points) fitted in the same launch when ``fit`` is given)."""
    import minidist

    per_rank = minidist.launch(_minidist_worker, world_size=world_size, transport=transport,
                               args=(cases, timing.as_dict(), fit), timeout=600)
    results = [rank_results for rank_results, _ in per_rank]
    return ([(fastest_block([rank_results[index][0] for rank_results in results]),
              results[0][index][1])
             for index in range(len(cases))], per_rank[0][1])


# --------------------------------------------------------------------------- options


@dataclass
class Options:
    collectives: list[str] | None = None
    algorithms: list[str] | None = None
    sizes: list[int] = field(default_factory=lambda: parse_sizes(DEFAULT_SIZES))
    world_sizes: list[int] = field(default_factory=lambda: [2, 4, 8])
    transports: list[str] = field(default_factory=lambda: ["shm"])
    timing: Timing = FULL
    mpich: bool = True
    gloo: bool = True
    params: dict = field(default_factory=dict)  # transport -> costmodel.Params
    #: fit alpha, beta, gamma in each launch, before its cases (else: params,
    #: or costmodel.PARAMS)
    fit: bool = True
    quick: bool = False


def params_from_p2p(path: str) -> dict:
    """{transport: Params} with alpha, beta and the exchange beta from a
    bench_p2p.py result file (gamma from :data:`minidist.costmodel.PARAMS`)."""
    with open(path) as file:
        fits = json.load(file)["fits"]
    return {transport: costmodel.Params(alpha=fit["alpha_seconds"],
                                        beta=fit["beta_seconds_per_byte"],
                                        gamma=costmodel.params_for(transport).gamma,
                                        exchange_beta=fit.get("exchange_beta_seconds_per_byte"))
            for transport, fit in fits.items() if transport in costmodel.PARAMS}


def options_from_args(args) -> Options:
    """Options from the parsed ``add_collectives_arguments`` flags."""
    timing = QUICK if args.quick else FULL
    if args.iterations is not None and args.iterations < 1:
        raise ValueError(f"--iterations must be 1 or more, got {args.iterations}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder):
            raise ValueError(f"--json {args.json}: the folder {folder} does not exist "
                             "(checked now, rather than after minutes of measuring)")
    if args.params and not os.path.isfile(args.params):
        raise ValueError(f"--params {args.params}: no such file; write one with "
                         "`python benchmarks/bench_p2p.py`")
    if args.iterations is not None or args.warmup is not None:
        timing = Timing(**{**timing.as_dict(), "iterations": args.iterations,
                           "warmup": args.warmup})
    sizes = (parse_sizes(args.sizes, args.factor) if args.sizes
             else QUICK_SIZES if args.quick else parse_sizes(DEFAULT_SIZES, args.factor))
    world_sizes = ([int(n) for n in parse_list(args.world_sizes)] if args.world_sizes
                   else list(QUICK_WORLD_SIZES) if args.quick
                   else [int(n) for n in parse_list(DEFAULT_WORLD_SIZES)])
    if min(world_sizes) < 2:
        raise ValueError(f"--world-sizes must be 2 or more ranks, got {world_sizes}")
    transports = parse_list(args.transport)
    for transport in transports:
        if transport not in ("shm", "pipe"):
            raise ValueError(f"--transport {transport!r}: minidist.launch has shm and pipe")
    collectives = parse_list(args.collectives)
    if args.quick and collectives is None:
        collectives = list(QUICK_COLLECTIVES)
    return Options(collectives=collectives,
                   algorithms=parse_list(args.algorithms), sizes=sizes,
                   world_sizes=world_sizes, transports=transports, timing=timing,
                   mpich=not args.no_mpich, gloo=not args.no_gloo,
                   params=params_from_p2p(args.params) if args.params else {},
                   fit=not (args.no_fit or args.params or args.quick), quick=args.quick)


def plan(options: Options) -> tuple[dict, list[str]]:
    """({collective: [algorithms to time]}, notes on what is left out and why)."""
    available = minidist_algorithms()
    notes = []
    wanted = options.collectives or list(ORDER)
    unknown = [c for c in wanted if c not in ORDER]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; choose from {list(ORDER)}")
    chosen = {}
    for collective in wanted:
        if collective not in available:
            if options.collectives:
                notes.append(f"{collective}: minidist has no implementation yet; skipped")
            continue
        algorithms = [a for a in available[collective]
                      if options.algorithms is None or a in options.algorithms]
        if algorithms:
            chosen[collective] = algorithms
        else:
            notes.append(f"{collective}: none of the chosen algorithms "
                         f"(it has {', '.join(available[collective])}); skipped")
    missing = [c for c in ORDER if c not in available]
    if missing and not options.collectives:
        notes.append("not in minidist yet, so not measured: " + ", ".join(missing))
    if options.algorithms:
        known = {a for algorithms in available.values() for a in algorithms}
        strangers = [a for a in options.algorithms if a not in known]
        if strangers:
            raise ValueError(f"unknown algorithm(s) {strangers}; minidist has "
                             f"{sorted(known)}")
    if not chosen:
        raise ValueError("nothing to measure: " + "; ".join(notes or ["no collectives"]))
    return chosen, notes


# --------------------------------------------------------------------------- running


def _predict(collective, algorithm, world_size, nbytes, params):
    try:
        return costmodel.predict(collective, algorithm, world_size, nbytes, params=params)
    except ValueError:
        return None  # no formula for this algorithm in the cost model


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def run(options: Options, console=None) -> dict:
    """Measure everything ``options`` asks for; the report as a JSON-ready dict."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    chosen, notes = plan(options)
    available_cores = cores()
    info = machine()
    console.print(f"machine: {info['cpu']}, {available_cores} cores, Python {info['python']}, "
                  f"NumPy {info['numpy']}; float32")
    oversubscribed = [n for n in options.world_sizes if n > available_cores]
    if oversubscribed:
        console.print(f"[yellow]oversubscribed:[/] world size(s) {oversubscribed} have more "
                      f"ranks than the {available_cores} cores; ranks take turns on the cores, "
                      "so their times include scheduling. Measured all the same.")
    if options.quick:
        console.print(f"quick: {', '.join(chosen)} ({sum(map(len, chosen.values()))} "
                      f"algorithms) at {', '.join(format_bytes(n) for n in options.sizes)} on "
                      f"{', '.join(map(str, options.world_sizes))} ranks, short timing "
                      "(fastest of 3 blocks)"
                      + ("" if options.fit else ", the cost model's parameters not fitted")
                      + (f", gloo on {options.world_sizes[0]} ranks only" if options.gloo
                         else "")
                      + "; every collective, size and target: leave out --quick")
    for note in notes:
        console.print(f"note: {note}")

    given = {transport: options.params.get(transport) or costmodel.params_for(transport)
             for transport in options.transports}
    params = {}  # "shm n=2" -> the Params its predictions used
    fits = {}  # "shm n=2" -> the points they were fitted on
    from minidist.bench import native

    natives = {}
    for kind, wanted, flag in (("mpich", options.mpich, "--no-mpich"),
                               ("gloo", options.gloo, "--no-gloo")):
        reason = native.missing(kind) if wanted else f"skipped ({flag})"
        natives[kind] = {"seconds": {}, "notes": {"all": reason} if reason else {}}
    rows = []
    started = time.perf_counter()
    for world_size in options.world_sizes:
        cases = [(collective, algorithm, nbytes)
                 for collective, algorithms in chosen.items()
                 for algorithm in algorithms
                 for nbytes in _sizes_of(collective, options.sizes)]
        for transport in options.transports:
            phase = time.perf_counter()
            fit = None
            if options.fit:
                largest = max(case_bytes(c, world_size, size) for c, _, size in cases)
                fit = {"largest": largest, "slots_alpha": given[transport].slots_alpha,
                       "repeats": 2 if options.quick else 3,
                       "budget": 8 * MIB if options.quick else 32 * MIB}
            measured, fitted = measure_minidist(transport, world_size, cases, options.timing,
                                                fit)
            key = f"{transport} n={world_size}"
            params[key] = fitted[0] if fitted else given[transport]
            if fitted:
                fits[key] = {kind: {str(size): seconds for size, seconds in points.items()}
                             for kind, points in fitted[1].items()}
            console.print(f"n={world_size}: minidist {transport}, {len(cases)} cases"
                          + (" (alpha, beta, gamma fitted first)" if fitted else "")
                          + f", {time.perf_counter() - phase:.1f} s")
            for (collective, algorithm, nbytes), (seconds, calls) in zip(cases, measured):
                rows.append(_row(transport, world_size, collective, algorithm, nbytes, seconds,
                                 calls, params[key], available_cores))
        for kind in ("mpich", "gloo"):
            if "all" in natives[kind]["notes"]:
                continue  # not asked for, or not installed
            if options.quick and kind == "gloo" and world_size != options.world_sizes[0]:
                natives[kind]["notes"][str(world_size)] = "left out of --quick"
                continue
            phase = time.perf_counter()
            measure = native.measure_mpich if kind == "mpich" else native.measure_gloo
            seconds, note = measure(world_size, list(chosen), options.sizes, options.timing)
            natives[kind]["notes"][str(world_size)] = note
            label = "MPICH" if kind == "mpich" else "gloo"
            if seconds is None:
                console.print(f"[yellow]n={world_size}: {label} failed:[/] {escape(note)}")
                continue
            natives[kind]["seconds"][str(world_size)] = {
                collective: {str(size): value for size, value in by_size.items()}
                for collective, by_size in seconds.items()}
            console.print(f"n={world_size}: {label}, {time.perf_counter() - phase:.1f} s")
    for row in rows:
        for kind in ("mpich", "gloo"):
            native_seconds = (natives[kind]["seconds"].get(str(row["world_size"]), {})
                              .get(row["collective"], {}).get(str(row["size"])))
            row[f"{kind}_seconds"] = native_seconds
            row[f"over_{kind}"] = _ratio(row["seconds"], native_seconds)

    report = {
        "about": "collective times, nccl-tests style (time = the slowest rank's mean per "
                 "call, in the fastest of the timed blocks; algbw = bytes / time; "
                 "busbw = algbw x nccl-tests' factor), float32, minidist next to MPICH "
                 "(mpi4py) and torch.distributed gloo, with the cost model's prediction; "
                 "written by minidist bench collectives",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "settings": {"collectives": chosen, "sizes": options.sizes,
                     "world_sizes": options.world_sizes, "transports": options.transports,
                     "timing": options.timing.as_dict(), "quick": options.quick},
        "oversubscribed_world_sizes": oversubscribed,
        "params": {key: {"alpha": p.alpha, "beta": p.beta, "gamma": p.gamma,
                         "exchange_beta": p.exchange_beta, "slots_alpha": p.slots_alpha,
                         "fitted_in_this_run": key in fits}
                   for key, p in params.items()},
        "fit_points": fits,
        "notes": notes,
        "mpich": natives["mpich"],
        "gloo": natives["gloo"],
        "rows": rows,
        "seconds_total": time.perf_counter() - started,
    }
    report["goals"] = goals(report)
    return report


def _row(transport, world_size, collective, algorithm, size, seconds, calls, params,
         available_cores) -> dict:
    nbytes = case_bytes(collective, world_size, size)
    factor = bus_factor(collective, world_size)
    algbw = nbytes / seconds / 1e9 if factor is not None and seconds > 0 else None
    predicted = _predict(collective, algorithm, world_size, nbytes, params)
    return {"transport": transport, "world_size": world_size, "collective": collective,
            "algorithm": algorithm, "size": size, "bytes": nbytes, "seconds": seconds,
            "iterations": calls, "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor if algbw is not None else None,
            "predicted_seconds": predicted,
            "measured_over_predicted": _ratio(seconds, predicted),
            "oversubscribed": world_size > available_cores}


# --------------------------------------------------------------------------- goals


def _as_printed(ratio: float) -> float:
    """A ratio as the report prints it (two decimals): a target is judged on
    the figure the user reads, so 0.504 printed "0.50" meets "<= 0.5"."""
    return float(f"{ratio:.2f}")


def goals(report: dict) -> list[dict]:
    """The three targets of ``minidist bench collectives``, with what this run
    measured for each: ``met`` is True (within the target), False (missed:
    ``missed`` says how, "slower than the target") or None (not measured).
    Each is judged on the ratio as printed, two decimals."""
    rows = [row for row in report["rows"] if row["transport"] == "shm"]
    results = []

    def best_all_reduce(world_size, size):
        candidates = [row for row in rows if row["collective"] == "all_reduce"
                      and row["world_size"] == world_size and row["size"] == size]
        return min(candidates, key=lambda row: row["seconds"]) if candidates else None

    mpich_notes = report.get("mpich", {}).get("notes", {})
    for world_sizes, size, limit, text in (
            ((2, 4), 64 * MIB, 0.5, "best shm all_reduce of 64 MiB <= 0.5 x MPICH Allreduce"),
            ((2,), 4 * KIB, 3.0, "best shm all_reduce of 4 KiB <= 3 x MPICH Allreduce")):
        values, unmeasured = {}, []
        for world_size in world_sizes:
            best = best_all_reduce(world_size, size)
            if best is not None and best["over_mpich"] is not None:
                values[str(world_size)] = {"algorithm": best["algorithm"],
                                           "seconds": best["seconds"],
                                           "mpich_seconds": best["mpich_seconds"],
                                           "ratio": best["over_mpich"]}
            elif best is None:
                unmeasured.append(f"n={world_size}: no shm all_reduce of "
                                  f"{format_bytes(size)} in this run")
            elif "all" in mpich_notes:
                unmeasured.append(f"MPICH not run: {mpich_notes['all']}")
            else:
                unmeasured.append(f"n={world_size}: MPICH "
                                  f"{mpich_notes.get(str(world_size)) or 'not run'}")
        # A verdict only on what was measured, all of it: a goal half measured
        # is reported, not judged.
        met = (all(_as_printed(value["ratio"]) <= limit for value in values.values())
               if not unmeasured else None)
        measured = "; ".join(
            f"n={n}: {v['algorithm']} {v['seconds'] * 1e6:,.0f} us vs MPICH "
            f"{v['mpich_seconds'] * 1e6:,.0f} us = {v['ratio']:.2f} x" for n, v in values.items())
        results.append({"goal": text, "world_sizes": list(world_sizes), "values": values,
                        "met": met, "missed": "slower than the target",
                        "measured": measured or "not measured in this run",
                        "not_measured": "; ".join(dict.fromkeys(unmeasured))})

    # The cost model gives every rank a core of its own; with more ranks than
    # cores they take turns, which no formula here prices. Such rows are
    # shown, not judged.
    values = {}
    for row in report["rows"]:
        if (row["algorithm"] == "ring" and row["bytes"] >= MIB
                and row["measured_over_predicted"] is not None):
            key = f"{row['collective']} {row['transport']} n={row['world_size']}"
            entry = values.setdefault(key, {"worst": row["measured_over_predicted"],
                                            "ratios": {}, "oversubscribed": row["oversubscribed"]})
            entry["ratios"][str(row["bytes"])] = row["measured_over_predicted"]
            if abs(row["measured_over_predicted"] - 1) > abs(entry["worst"] - 1):
                entry["worst"] = row["measured_over_predicted"]
    judged = [v for v in values.values() if not v["oversubscribed"]]
    fitted = any(p.get("fitted_in_this_run") for p in report.get("params", {}).values())
    unfitted_quick = report.get("settings", {}).get("quick") and not fitted
    if unfitted_quick:
        judged = []  # predictions from another machine's parameters judge nothing
    met = all(0.75 <= _as_printed(v["worst"]) <= 1.25 for v in judged) if judged else None
    measured = "; ".join(f"{key}: worst {v['worst']:.2f}"
                         + (" (oversubscribed: shown, not judged)" if v["oversubscribed"] else "")
                         for key, v in values.items())
    results.append({"goal": "ring measured / predicted within 0.75 .. 1.25 for sizes >= 1 MiB "
                            "(world sizes with a core per rank)",
                    "values": values, "met": met,
                    "missed": "further from the prediction than the target",
                    "measured": measured or "not measured in this run",
                    "not_measured": "" if judged else
                    ("not judged in --quick: alpha, beta, gamma were not fitted in this run "
                     "(leave out --quick)" if unfitted_quick
                     else "every ring row of 1 MiB or more ran oversubscribed" if values
                     else "no ring collective of 1 MiB or more in this run")})
    return results


# --------------------------------------------------------------------------- printing


def _us(seconds):
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:,.1f}" if us < 100 else f"{us:,.0f}"


def _number(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def _describe_params(transport: str, params: dict) -> str:
    def rate(seconds_per_byte):
        return f"{1 / seconds_per_byte / 1e9:.1f} GB/s" if seconds_per_byte else "inf"

    exchange = params.get("exchange_beta")
    return (f"{transport} alpha {params['alpha'] * 1e6:.2f} us, 1/beta {rate(params['beta'])}, "
            + (f"1/exchange beta {rate(exchange)}, " if exchange else "")
            + f"1/gamma {rate(params['gamma'])}")


def _tables(console, title: str, headers: list, lines: list) -> list:
    """The table of one group: whole when it fits the console (a file or a
    pipe is 150 wide), else in two, minidist's columns and then the peers'
    (MPICH, gloo), each beginning with the size and the algorithm, so that at
    80 columns no cell is cut ("recursive_doub…", "1,0…")."""
    from rich.table import Table

    def table(columns, heading):
        made = Table(title=heading, title_justify="left")
        for index in columns:
            made.add_column(headers[index], justify="left" if index == 1 else "right",
                            no_wrap=True, overflow="fold")
        for first, cells in lines:
            if first and made.row_count:
                made.add_section()
            made.add_row(*(cells[index] for index in columns))
        return made

    widths = [max(len(headers[i]), *(len(cells[i]) for _, cells in lines))
              for i in range(len(headers))]
    if len(headers) == 7 or sum(widths) + 3 * len(widths) + 1 <= console.width:
        return [table(range(len(headers)), title)]
    return [table(range(7), title),
            table([0, 1, *range(7, len(headers))], f"{title}: next to the peers")]


def print_report(report: dict, console=None) -> None:
    """One Rich table per transport, collective and world size, then the targets."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    show = {kind: bool(report[kind]["seconds"]) for kind in ("mpich", "gloo")}
    available_cores = report["machine"]["cores"]
    groups: dict = {}
    for row in report["rows"]:
        key = (row["transport"], row["collective"], row["world_size"])
        groups.setdefault(key, []).append(row)
    for (transport, collective, world_size), rows in groups.items():
        title = f"{collective}, {world_size} ranks, {transport}"
        if world_size > available_cores:
            title += f" (oversubscribed: {world_size} ranks on {available_cores} cores)"
        headers = ["size", "algorithm", "time us", "algbw", "busbw", "model us", "/model"]
        for kind, label in (("mpich", "MPICH"), ("gloo", "gloo")):
            if show[kind]:
                headers += [f"{label} us", f"/{label}"]
        rows = sorted(rows, key=lambda row: (row["size"], row["seconds"]))
        lines = []  # (first of its size, cells)
        previous_size = None
        for row in rows:
            first = row["size"] != previous_size
            previous_size = row["size"]
            cells = [format_bytes(row["bytes"]) if first and collective != "barrier" else "",
                     row["algorithm"], _us(row["seconds"]), _number(row["algbw_GBps"]),
                     _number(row["busbw_GBps"]), _us(row["predicted_seconds"]),
                     _number(row["measured_over_predicted"])]
            for kind in ("mpich", "gloo"):
                if show[kind]:
                    cells += [_us(row[f"{kind}_seconds"]) if first else "",
                              _number(row[f"over_{kind}"])]
            lines.append((first, cells))
        for table in _tables(console, title, headers, lines):
            console.print(table)
        worst = max((row for row in rows if row["measured_over_predicted"]),
                    key=lambda row: abs(math.log(row["measured_over_predicted"])), default=None)
        if worst is not None:
            fitted = any(p.get("fitted_in_this_run") for p in report["params"].values())
            console.print(f"  largest gap, {worst['algorithm']} at {format_bytes(worst['bytes'])}: "
                          + compare(worst["seconds"], worst["predicted_seconds"], RunFacts(
                              ranks=world_size, cores=available_cores, transport=transport,
                              params="fitted" if fitted else "default", nbytes=worst["bytes"],
                              load=report["machine"].get("load"))),
                          markup=False, highlight=False)
    blocks = report["settings"]["timing"].get("blocks", 1)
    console.print("time: the slowest rank's mean per call"
                  + (f", fastest of {blocks} timed blocks" if blocks > 1 else "")
                  + "; algbw = size / time and busbw = "
                  "algbw x nccl-tests' factor, in GB/s; model: costmodel.predict with "
                  + ("alpha, beta, gamma fitted in this run (ping-pong, exchange and np.add "
                     "on ranks 0 and 1 before the cases): "
                     if any(p.get("fitted_in_this_run") for p in report["params"].values())
                     else "")
                  + "; ".join(_describe_params(key, params)
                              for key, params in report["params"].items())
                  + "; /model: measured / predicted"
                  + ("; /MPICH, /gloo: minidist's time divided by theirs (below 1: minidist "
                     "is faster)" if show["mpich"] or show["gloo"] else ""))
    for kind, label in (("mpich", "MPICH"), ("gloo", "gloo")):
        notes = report[kind]["notes"]
        for note in dict.fromkeys(notes.values()):  # distinct, in order
            where = [n for n, text in notes.items() if text == note and n != "all"]
            prefix = f" (n={','.join(where)})" if where and len(where) < len(notes) else ""
            console.print(f"{label}{prefix}: {escape(note)}")
    print_goals(report, console)


def print_goals(report: dict, console) -> None:
    """The targets and, for each, "within the target", how it was missed
    ("slower than the target") or "not measured", with the figures."""
    from rich.markup import escape

    console.print("[bold]targets[/] (each judged on the ratio as printed)")
    for goal in report["goals"]:
        if goal["met"] is None:  # no verdict on what this run did not measure
            console.print(f"  [dim]not measured[/]  {goal['goal']}: "
                          + escape(goal.get("not_measured") or "not in this run")
                          + (f" (measured: {goal['measured']})" if goal["values"] else ""))
            continue
        verdict = ("[green]within the target[/]" if goal["met"]
                   else f"[red]{goal.get('missed', 'outside the target')}[/]")
        console.print(f"  {verdict}  {goal['goal']}: {goal['measured']}")


def write_json(report: dict, path: str) -> None:
    import os

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    from minidist.atomic_file import atomic_write

    with atomic_write(path) as file:
        json.dump(report, file, indent=1)


def run_from_args(args, console=None) -> int:
    """What ``minidist bench collectives`` and benchmarks/bench_collectives.py do."""
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            # A file or a pipe: no need to squeeze the tables (COLUMNS, when
            # set, is the width asked for).
            console = Console(width=150)
    try:
        options = options_from_args(args)
        report = run(options, console)
    except (ValueError, OSError) as error:
        print(f"minidist bench collectives: error: {error}", file=sys.stderr)
        return 2
    print_report(report, console)
    console.print(f"measured in {report['seconds_total']:.0f} s")
    if args.json:
        write_json(report, args.json)
        console.print(f"written: {args.json}")
    return 0


def main(argv=None, default_json: str | None = None) -> int:
    import argparse

    from minidist.bench import add_collectives_arguments

    parser = argparse.ArgumentParser(prog="bench_collectives",
                                     description=__doc__.splitlines()[0])
    add_collectives_arguments(parser)
    args = parser.parse_args(argv)
    if args.json is None:
        args.json = default_json
    return run_from_args(args)
