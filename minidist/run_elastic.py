"""``minidist run --max-restarts K -n MIN:MAX script.py``: attempts until one succeeds.

torchrun's elastic agent, on one machine. Each attempt is a whole
``minidist run`` (:func:`minidist.run_script.run_attempt`): fresh ranks, a
fresh control block and transport; when a rank fails, every rank is ended
and the culprit named, as without restarts, and the attempt's shared memory
is released before anything else starts. Then :mod:`minidist.runtime.restarts`
decides: another attempt (on fewer ranks if some were marked lost), or give
up, with one line saying which and why. The script resumes from its own
checkpoint (:mod:`minidist.parallel.resilience`); the launcher keeps nothing
of a failed attempt but its trace.

The trace (``--trace FILE``) holds every attempt: each event carries an
``attempt`` field (0, 1, ...) and the header lists the attempts (number,
size, start, end, how it ended), which the timeline draws as dashed lines.
A reader that knows neither reads the file as before.

What it costs: a restart is a full start (fork, the ranks' imports, the run's
memory) plus the script's load of its checkpoint and the steps it redoes;
``benchmarks/bench_elastic.py`` measures it against starting the script again
by hand.
"""

from __future__ import annotations

import os

from minidist.run_script import check_arguments, run_attempt, write_trace
from minidist.runtime import restarts


def run_elastic(args) -> int:
    """Run the attempts; 0 when one succeeds, 1 when the run gives up."""
    low, high = restarts.parse_sizes(args.nproc)
    if args.transport == "mpi":
        raise SystemExit("minidist run: error: --max-restarts restarts ranks it forked itself; "
                         "under --transport mpi, mpiexec starts them (use shm or pipe)")
    policy = restarts.RestartPolicy(low, high, args.max_restarts)
    check_arguments(args)
    import shutil
    import tempfile

    from minidist.runtime import segment_reaper

    # Named as the attempts' own run folders are, so that the reaper removes
    # it too if this process is killed outright.
    prefix = segment_reaper.run_folder_prefix(os.getpid(), tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=os.path.basename(prefix) + "elastic-",
                              dir=os.path.dirname(prefix))
    run_id = os.environ.get(restarts.RUN_ID) or os.urandom(6).hex()
    world, events, attempts = high, [], []
    try:
        while True:
            number = policy.restarts
            env = {restarts.RESTART_COUNT: str(number),
                   restarts.MAX_RESTARTS: str(policy.max_restarts),
                   restarts.RUN_ID: run_id, restarts.ELASTIC_DIR: folder}
            attempt = run_attempt(args, world, env, collect_trace=args.trace is not None)
            for event in attempt.events or ():
                event["attempt"] = number
                events.append(event)
            error = attempt.error
            attempts.append({"attempt": number, "world_size": world, "start": attempt.started,
                             "end": attempt.ended,
                             "outcome": "ok" if error is None else _first_line(error)})
            if attempt.code == 0:
                if number:
                    _say(f"attempt {number + 1} of {policy.attempts} succeeded on {world} "
                         f"rank{'s' if world != 1 else ''}", style="bold green")
                return 0
            lost = restarts.lost_ranks(folder, number, attempt.exit_codes) & set(range(world))
            world, line = policy.decide(world, error.rank, _first_line(error), lost,
                                        restarts.no_restart_asked(folder, number))
            _say(line)
            if world is None:
                return 1
    finally:
        if args.trace is not None:
            write_trace(events, args.trace, high, args.transport, attempts=attempts,
                        run_id=run_id)
        shutil.rmtree(folder, ignore_errors=True)


def _first_line(error) -> str:
    return (getattr(error, "summary", "") or str(error)).split("\n")[0]


def _say(line: str, style: str = "bold red") -> None:
    from rich.console import Console

    stderr = Console(stderr=True)
    stderr.print("minidist run:", style=style, end=" ")
    stderr.print(line, markup=False, highlight=False, soft_wrap=True)
