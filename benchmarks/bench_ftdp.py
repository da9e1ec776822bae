"""Fault-tolerant data parallel against plain DDP: what the quorum costs a
step when nothing fails, and what it saves when a replica dies.

    .venv/bin/python benchmarks/bench_ftdp.py                # 9 rounds: what the results hold
    .venv/bin/python benchmarks/bench_ftdp.py --rounds 3     # shorter
    .venv/bin/python benchmarks/bench_ftdp.py --quick        # a smoke run

Two measurements, each interleaved (A, B, A, B, ...) so that a machine
whose load changes during the run slows both sides alike, and reported as
medians over the rounds, with the median of each round's ratio in (a) and
the ratio of the medians in (b):

(a) **a step without a fault.** One launch per round of 4 ranks (shm): on
    every rank ``--steps`` steps of plain DDP
    (:class:`minidist.parallel.data.DistributedDataParallel`, one bucket and
    the ring all_reduce, as fault-tolerant DDP's) and the same steps of fault-tolerant DDP
    (torchft's shape, :mod:`minidist.parallel.resilience`: the quorum's
    agreement, the gradient all_reduce over the members, the commit's copy
    of the state), the same model, the same initial weights and the same
    batches, after a barrier each, the order alternating from round to
    round. The step time is the slowest rank's mean over the steps. The
    bytes and messages per rank and step come from one traced launch (the
    trace's send events inside each side's region): what the agreement adds
    is one all_reduce of the 6 W int64 rows (W the world size), the rest is
    the same gradient. Both sides' weights after the steps are checked to
    agree (they train the same steps on the same batches).

(b) **from a death to the group going on.** Under fault-tolerant DDP (world
    4, replicas 4, no spare) replica 2 is SIGKILLed at step 3, before its
    gradient is ready: the time from the kill (the victim writes its clock
    just before) to the first step the survivors commit after it: the
    supervisor's notice, the all_reduce that ends in PeerGoneError, a new
    quorum, the step redone at 3 of 4. Against it, an elastic-style restart
    of the whole job (torchelastic's answer to a death): the time to start a
    fresh ``minidist.launch`` of the same world, build the model and DDP and
    do the first step. That is what a restart costs *at least*: here the
    launch forks a warm parent (no interpreter start, no imports), with no
    failure to notice first and no checkpoint to read.

Writes ``benchmarks/results/ftdp.md`` (``--out FILE``): the tables and the
machine's facts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

WORLD = 4
#: A linear layer 64 -> 16 (1,040 parameters) on 256 examples, a global batch of 64.
PROBLEM = dict(steps=0, examples=256, features=64, outputs=16, batch=64, lr=0.05)
FAULT_RANK, FAULT_STEP, FAULT_STEPS = 2, 3, 6


def _problem(steps: int):
    from minidist.parallel.resilience import RegressionProblem

    return RegressionProblem(**dict(PROBLEM, steps=steps))


# --------------------------------------------------------------------------- (a) a step


def _plain_steps(problem, steps: int):
    """Plain DDP: one untimed step (the first pays for what is done once), then
    ``steps`` timed, in the trace region "plain steps"; (seconds per step, the weights)."""
    import minidist.distributed as dist
    from minidist import trace
    from minidist.parallel.data import DistributedDataParallel

    inputs, targets = problem.data()
    model, optimizer = problem.model_and_optimizer()
    ddp = DistributedDataParallel(model, algorithm="ring")  # the all_reduce FT-DDP uses
    rank = dist.get_rank()

    def one_step(step):
        optimizer.zero_grad()
        problem.loss(ddp, problem.batch_indices(step, rank, WORLD), inputs, targets).backward()
        optimizer.step()

    one_step(0)
    dist.barrier()
    start = time.perf_counter()
    with trace.region("plain steps"):
        for step in range(1, steps + 1):
            one_step(step)
    seconds = (time.perf_counter() - start) / max(steps, 1)
    return seconds, [np.array(p.data) for p in model.parameters()]


def _tolerant_steps(problem, steps: int):
    """Fault-tolerant DDP: the same, its first step untimed (its first quorum
    heals every replica from rank 0, a cost paid once), the timed ones in
    the trace region "tolerant steps"."""
    import minidist.distributed as dist
    from minidist import trace
    from minidist.parallel.resilience import (
        FaultTolerantDDP,
        Manager,
        OptimizerWrapper,
        model_and_optimizer_state,
    )

    inputs, targets = problem.data()
    model, optimizer = problem.model_and_optimizer()
    state_dict, load_state_dict = model_and_optimizer_state(model, optimizer)
    manager = Manager(state_dict=state_dict, load_state_dict=load_state_dict, replicas=WORLD,
                      total_steps=steps + 1, batch_indices=problem.batch_indices)
    ddp, wrapped = FaultTolerantDDP(manager, model), OptimizerWrapper(manager, optimizer)

    def one_step():
        wrapped.zero_grad()   # the quorum's agreement
        if manager.is_participating():
            problem.loss(ddp, manager.batch(), inputs, targets).backward()
        wrapped.step()        # applied only on commit (and the state kept before it)

    one_step()
    dist.barrier()
    start = time.perf_counter()
    with trace.region("tolerant steps"):
        for _ in range(steps):
            one_step()
    seconds = (time.perf_counter() - start) / max(steps, 1)
    wrapped.zero_grad()  # the last agreement: every replica done
    if not manager.finished():
        raise RuntimeError(f"bench_ftdp: rank {dist.get_rank()} did not finish its steps")
    return seconds, [np.array(p.data) for p in model.parameters()]


def _step_worker(problem, steps: int, order: tuple):
    return {side: (_plain_steps if side == "plain" else _tolerant_steps)(problem, steps)
            for side in order}


def _traffic(path: str, steps: int) -> dict:
    """{side: [(bytes, messages) of each rank]} per step, in each side's timed region."""
    from minidist import trace

    events = trace.read_jsonl(path).events
    found = {}
    for side in ("plain", "tolerant"):
        per_rank = []
        for rank in range(WORLD):
            region = next(e for e in events if e["rank"] == rank and e["kind"] == "compute"
                          and e["label"] == f"{side} steps")
            sends = [e for e in events if e["rank"] == rank and e["kind"] == "send"
                     and region["start"] <= e["start"] and e["end"] <= region["end"]
                     and e["peer"] != rank]
            per_rank.append((sum(e["bytes"] for e in sends) / steps, len(sends) / steps))
        found[side] = per_rank
    return found


def measure_steps(rounds: int, steps: int) -> dict:
    import minidist

    problem = _problem(steps)
    times = {"plain": [], "tolerant": []}
    for index in range(rounds):
        order = ("plain", "tolerant") if index % 2 == 0 else ("tolerant", "plain")
        results = minidist.launch(_step_worker, world_size=WORLD, transport="shm",
                                  args=(problem, steps, order), log_level="ERROR")
        for result in results:  # the same steps on the same batches: the same weights
            for a, b in zip(result["plain"][1], result["tolerant"][1]):
                if not np.allclose(a, b, rtol=1e-9, atol=1e-12):
                    raise RuntimeError("bench_ftdp: plain and fault-tolerant DDP's weights "
                                       "differ after the same steps")
        for side in times:
            times[side].append(max(result[side][0] for result in results))
        print(f"(a) round {index + 1}/{rounds}: plain {times['plain'][-1] * 1e3:.3f} ms, "
              f"fault-tolerant {times['tolerant'][-1] * 1e3:.3f} ms per step", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "steps.trace.jsonl")
        minidist.launch(_step_worker, world_size=WORLD, transport="shm",
                        args=(problem, 3, ("plain", "tolerant")), trace=path,
                        log_level="ERROR")
        sent = _traffic(path, 3)
    return {"times": times, "sent": sent}


# --------------------------------------------------------------------------- (b) a death


def _going_on(problem, time_file: str):
    from minidist.parallel.resilience import ReplicaFault, train

    fault = ReplicaFault(FAULT_RANK, FAULT_STEP, "sigkill", "compute", time_file=time_file)
    result, _ = train(problem, WORLD, fault)
    return result.commit_times


def _restart(problem):
    """A fresh job's first step: build, wrap, one step; the clock after it."""
    _plain_steps(problem, 1)
    return time.time()


def measure_death(rounds: int) -> dict:
    import minidist

    # Imported here, in the parent, so that the restart's workers fork with
    # them loaded: what a restart costs at least, not a first import.
    import minidist.parallel.data  # noqa: F401
    import minidist.parallel.resilience  # noqa: F401

    problem = _problem(FAULT_STEPS)
    seconds = {"tolerant": [], "restart": []}
    for index in range(rounds):
        with tempfile.NamedTemporaryFile(suffix=".time", delete=False) as file:
            time_file = file.name
        try:
            results = minidist.launch(_going_on, world_size=WORLD, transport="shm",
                                      args=(problem, time_file), tolerate_failures=True,
                                      log_level="ERROR")
            with open(time_file) as file:
                fault_time = float(file.read())
        finally:
            os.unlink(time_file)
        survivor = results[0 if FAULT_RANK else 1]
        after = [t for t in survivor if t > fault_time]
        if not after:
            raise RuntimeError("bench_ftdp: the survivors committed no step after the kill")
        seconds["tolerant"].append(min(after) - fault_time)
        started = time.time()
        done = minidist.launch(_restart, world_size=WORLD, transport="shm", args=(problem,),
                               log_level="ERROR")
        seconds["restart"].append(max(done) - started)
        print(f"(b) round {index + 1}/{rounds}: going on {seconds['tolerant'][-1] * 1e3:.1f} ms, "
              f"restart {seconds['restart'][-1] * 1e3:.1f} ms", flush=True)
    return seconds


# --------------------------------------------------------------------------- the tables

#: What the results file says before its tables (the docstring, as Markdown).
DESCRIPTION = """\
Fault-tolerant data parallel (`minidist/parallel/resilience/`, torchft's
`Manager`, `DistributedDataParallel` and `OptimizerWrapper`) against plain
DDP (`minidist.parallel.data.DistributedDataParallel`), on 4 processes over
shared memory, a linear layer 64 -> 16 (1,040 float64 parameters) and a
global batch of 64 (16 examples a rank), SGD with momentum. Both sides run
in the same rounds, interleaved, and the tables give medians over the
rounds and ratios.

* **(a) a step without a fault**: one launch per round; on every rank the
  timed steps of plain DDP (one bucket, the ring all_reduce) and of
  fault-tolerant DDP (the quorum's agreement, the same ring all_reduce over
  the members, the copy of the state kept at each commit), the same initial
  weights and batches, each after an untimed first step and a barrier, the
  order alternating from round to round; the slowest rank's mean step. The
  weights after the steps are checked to be the same on both sides. Bytes
  and messages per rank and step come from one traced launch (the send
  events inside each side's timed region): the agreement adds one
  all_reduce of the 6 W int64 rows (W = 4: 192 B, 288 B sent per rank on the
  ring, 6 messages).
* **(b) from a death to the group going on**: replica 2 is SIGKILLed at
  step 3 before its gradient is ready; the time from the kill (the victim
  writes its clock just before) to the survivors' next committed step (the
  supervisor's notice, the all_reduce ending in PeerGoneError, a new quorum,
  the step redone at 3 of 4). Against it, an elastic-style restart of the
  whole job, as torchelastic answers a death: a fresh `minidist.launch` of
  the same world, building the model and DDP, and its first step. That is
  what a restart costs at least: the launch forks a warm parent (no
  interpreter start, no imports), with no failure to notice first and no
  checkpoint to read or write.

Run `.venv/bin/python benchmarks/bench_ftdp.py` (`--rounds`, `--steps`,
`--quick`); it writes this file.
"""

#: What the figures say, after the tables (no figure in it: they change from run to run).
READING = """\
## Reading the figures

* (a) On a model this small the step is mostly fixed costs, so the
  agreement shows at its largest: one more all_reduce (a ring of 4: 6
  messages of a few dozen bytes) on the critical path of every step, and a
  copy of the state at each commit. Its bytes are next to nothing beside the
  gradient's; its latency is what it costs, and it does not shrink with a
  bigger model, so its share does.
* (b) Most of the time to go on is the survivors noticing the death: a rank
  asleep in a collective reads its peers' status records every
  `CHECK_SECONDS` (`minidist/distributed/collectives/fingerprints.py`), and
  the death is seen at the next read; then a new quorum, and the step
  redone. The restart row is a floor, and a low one: a real elastic restart
  (torchelastic) first notices the failure, starts fresh interpreters that
  import the program, reads a checkpoint, and loses every step since it was
  written; fault-tolerant DDP loses only the step in flight, and goes on at
  3 of 4 until a spare joins.
"""


def _range(values, scale=1e3, digits=2) -> str:
    return (f"{statistics.median(values) * scale:.{digits}f} "
            f"[{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}]")


def tables(steps: dict, death: dict, rounds: int, n_steps: int) -> str:
    plain, tolerant = steps["times"]["plain"], steps["times"]["tolerant"]
    ratios = [t / p for t, p in zip(tolerant, plain)]
    sent = steps["sent"]
    lines = [f"(a) a step without a fault: world {WORLD} (shm), a linear layer "
             f"{PROBLEM['features']} -> {PROBLEM['outputs']} "
             f"({PROBLEM['features'] * PROBLEM['outputs'] + PROBLEM['outputs']:,} float64 "
             f"parameters), global batch {PROBLEM['batch']}; median [min-max] of {rounds} "
             f"rounds of {n_steps} steps, the slowest rank's mean step",
             "",
             "| side | step ms | / plain DDP (each round's ratio) | bytes sent per rank | "
             "/ plain DDP | messages per rank |",
             "|---|---:|---:|---:|---:|---:|"]
    plain_bytes = statistics.median(b for b, _ in sent["plain"])
    for name, label, values in (("plain", "plain DDP", plain),
                                ("tolerant", "fault-tolerant DDP", tolerant)):
        nbytes = statistics.median(b for b, _ in sent[name])
        messages = statistics.median(m for _, m in sent[name])
        ratio = "1.00" if name == "plain" else (
            f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        lines.append(f"| {label} | {_range(values, digits=3)} | {ratio} | {nbytes:,.0f} | "
                     f"{nbytes / plain_bytes:.3f} | {messages:.1f} |")
    going, restart = death["tolerant"], death["restart"]
    lines += ["",
              f"(b) from a SIGKILL of replica {FAULT_RANK} at step {FAULT_STEP} to the next "
              f"committed step (world {WORLD}, shm), against a fresh launch of the same world "
              f"and its first step; median [min-max] of {len(going)} rounds",
              "",
              "| side | ms | / restart |",
              "|---|---:|---:|",
              f"| fault-tolerant DDP: the group goes on at {WORLD - 1} of {WORLD} | "
              f"{_range(going, digits=1)} | "
              f"{statistics.median(going) / statistics.median(restart):.2f} |",
              f"| restart of the whole job (at least) | {_range(restart, digits=1)} | 1.00 |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 9; quick 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per side and round in (a) (default 100; quick 3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "ftdp.md"),
                        help="the markdown file the tables are written to")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 9)
    n_steps = args.steps or (3 if args.quick else 100)

    import logging
    import warnings

    from minidist.bench.common import machine

    warnings.simplefilter("ignore")  # more ranks than cores: said once, known here
    # The launcher's warning that the tolerated rank died: killed on purpose here.
    logging.getLogger("minidist").setLevel(logging.ERROR)
    facts = machine()
    steps = measure_steps(rounds, n_steps)
    death = measure_death(rounds)
    text = tables(steps, death, rounds, n_steps)
    print("\n" + text)
    header = (f"# Fault-tolerant data parallel against plain DDP and a restart "
              f"(`bench_ftdp.py`)\n\n{DESCRIPTION}\n"
              f"## Latest results\n\n{facts['cpu']}, {facts['cores']} cores, load average "
              f"{facts['load']} at the start, Python {facts['python']}, NumPy {facts['numpy']}, "
              f"{time.strftime('%Y-%m-%d')}; `{' '.join(['bench_ftdp.py'] + (argv or sys.argv[1:]))}`\n\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as file:
        file.write(header + text + "\n\n" + READING)
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
