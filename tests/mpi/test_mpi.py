"""The mpi transport under a real mpiexec.

* the collectives suite (tests/mpi/collectives_under_mpi.py: every collective
  x algorithm, several sizes, two dtypes; then FSDP of a GPT with a tied
  embedding, each sharding strategy) in one mpiexec launch per world size, 2,
  3 and 4 ranks;
* a rank that raises ends the whole job within seconds, its rank and error
  named, while the others wait for it (MPI_Abort, no hang);
* without mpiexec: choosing the mpi transport anywhere else says what to do.

The mpiexec tests skip, saying why, where mpi4py or mpiexec is missing
(`pip install -e '.[mpi]'` brings both: mpi4py and the `mpich` wheel).

Settings. Ranks never block inside MPI (the transport polls with Iprobe and
Test, then naps 100 us), so MPICH needs no busy-poll or yield settings to
run 4 ranks on 2 cores: none are set. OPENBLAS_NUM_THREADS=1 keeps the
ranks' BLAS from oversubscribing further. Open MPI refuses more ranks than
cores unless told --oversubscribe, which is added when mpiexec is Open MPI's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minidist.runtime.job_segments import JobSegments, mapped_segments, segments_now

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SUITE = HERE / "collectives_under_mpi.py"


def _mpiexec() -> str | None:
    from minidist.bench.common import find_mpiexec  # beside this Python, else on PATH

    return find_mpiexec()


def _skip_reason() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e '.[mpi]')"
    if _mpiexec() is None:
        return "no mpiexec on PATH or beside this Python (pip install -e '.[mpi]')"
    return None


needs_mpi = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _run(script: Path, ranks: int, timeout: float,
         extra_env=None) -> tuple[subprocess.CompletedProcess, float]:
    mpiexec = _mpiexec()
    command = [mpiexec, "-n", str(ranks)]
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        command.append("--oversubscribe")
    # Not the rank identity of an enclosing MPI job; Open MPI's settings
    # (OMPI_MCA_*, OMPI_ALLOW_RUN_AS_ROOT*) are kept.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MINIDIST_", "PMI_", "OMPI_COMM_WORLD_", "PMIX_"))}
    env["OPENBLAS_NUM_THREADS"] = "1"
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    process = subprocess.Popen(command + [sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    segments = JobSegments(process.pid)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        # MPICH leaves its shared-memory segments behind when a job ends by
        # MPI_Abort (3 MB per aborted 3-rank job): remove this job's, only.
        segments.remove()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return result, time.perf_counter() - start


def _leftover(before: set[str]) -> set[str]:
    """MPICH segments made since ``before`` that no process maps: leaked.
    (Other jobs on this machine, other tests' included, map theirs.)"""
    new = segments_now() - before
    if not new:
        return set()
    mapped = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            mapped |= mapped_segments(int(entry))
    return new - mapped


def _processes_of(marker: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if marker.encode() in file.read():
                    with open(f"/proc/{entry}/stat") as stat:
                        found.append(stat.read().split(")")[0] + ")")
        except (OSError, ValueError):
            pass
    return found


def _no_ranks_left(marker: str, within: float = 5.0) -> None:
    """No process of a job whose command line holds ``marker`` (its script's
    path) is left a few seconds after the job ended (mpiexec may return while
    its process manager still takes the ranks down)."""
    deadline = time.monotonic() + within
    while (left := _processes_of(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of {marker} still running: {left}"


@needs_mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_every_collective_algorithm_under_mpiexec(ranks):
    result, _ = _run(SUITE, ranks, timeout=360)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"mpi transport, {ranks} ranks: 29 algorithms" in result.stdout, output[-3000:]
    assert "0 failures over all ranks" in result.stdout, output[-3000:]


@needs_mpi
@pytest.mark.timeout(120)
def test_a_raising_rank_ends_the_job_naming_itself(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group(timeout=600)
        rank = dist.get_rank()
        dist.all_reduce(np.ones(8))
        if rank == 1:
            raise ValueError("deliberate failure on rank one")
        dist.recv(np.empty(4), src=1)  # the others wait for rank 1, which never sends
    """))
    before = segments_now()
    result, seconds = _run(script, 3, timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "rank 1 of 3 failed with ValueError: deliberate failure on rank one" in output, \
        f"mpiexec returned {result.returncode} with output: {output!r}"
    assert "MPI_Abort" in output, output
    assert seconds < 30, f"the job took {seconds:.1f} s to end:\n{output}"
    # MPI_Abort kills the ranks outright; the aborting rank unlinked MPICH's
    # segments first (plain mpiexec: no launcher of minidist's to do it).
    assert _leftover(before) == set()


@needs_mpi
@pytest.mark.timeout(120)
def test_traced_like_the_other_transports(tmp_path):
    import json

    script = tmp_path / "traced.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group()
        dist.all_reduce(np.ones(1000), algorithm="ring")
    """))
    result, _ = _run(script, 2, timeout=90, extra_env={"MINIDIST_TRACE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
        events = [json.loads(line) for line in lines[1:]]
        kinds = sorted(event["kind"] for event in events)
        assert kinds == ["collective", "recv", "recv", "send", "send"], kinds
        assert {event["peer"] for event in events if event["kind"] != "collective"} == {1 - rank}
        assert sum(event["bytes"] for event in events if event["kind"] == "send") == 8000


# --------------------------------------------------------------------------- no mpiexec needed


def test_launchers_refuse_mpi_and_say_to_use_mpiexec():
    import minidist
    from minidist.distributed.transport import check_name

    with pytest.raises(ValueError, match=r"mpiexec -n 4 python script.py"):
        check_name("mpi")
    with pytest.raises(ValueError, match="mpiexec"):
        minidist.launch(lambda: None, world_size=2, transport="mpi")


def _native_all_reduce():
    import numpy as np

    import minidist.distributed as dist

    dist.all_reduce(np.ones(4), algorithm="native")


def test_native_algorithm_elsewhere_says_it_needs_mpiexec():
    import minidist

    with pytest.raises(Exception, match=r"only the 'mpi' transport has; this run uses the "
                                        r"'pipe' transport.*mpiexec"):
        minidist.launch(_native_all_reduce, world_size=2, transport="pipe")
    # The simulator has no MPI library either.
    from minidist.distributed.collectives.native import check_available

    class Group:
        _global_rank = 0
        transport = type("T", (), {"name": "sim"})()

    with pytest.raises(ValueError, match="'sim' transport"):
        check_available(Group(), "broadcast")


def test_without_mpi4py_the_error_says_how_to_install(monkeypatch):
    from minidist.distributed.transport import mpi

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now fails
    with pytest.raises(ImportError, match=r"pip install -e '\.\[mpi\]'"):
        mpi.load_mpi()


def test_mpi_launch_is_recognized_from_the_environment():
    from minidist.distributed.transport.mpi import launched_by_mpi, mpi_environment

    assert mpi_environment({"PMI_RANK": "2", "PMI_SIZE": "4"}) == (2, 4)
    assert mpi_environment({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}) == (1, 3)
    assert not launched_by_mpi({"PMI_RANK": "0"})  # a rank without a size is no MPI run
    assert not launched_by_mpi({})


def test_only_the_mpi_transport_imports_mpi4py():
    # (minidist/bench/native.py, the MPICH baseline of `minidist bench
    # collectives`, is a separate program and uses mpi4py's own collectives.)
    importers = [path.relative_to(ROOT).as_posix()
                 for path in (ROOT / "minidist" / "distributed").rglob("*.py")
                 if any(line.lstrip().startswith(("import mpi4py", "from mpi4py"))
                        for line in path.read_text().splitlines())]
    assert importers == ["minidist/distributed/transport/mpi.py"]


@needs_mpi
@pytest.mark.timeout(120)
def test_minidist_run_starts_the_script_with_mpiexec_and_cleans_up(tmp_path):
    """``minidist run --transport mpi`` runs the same script under mpiexec; a
    rank that raises is named, the status is non-zero, and the segment MPICH
    leaves on MPI_Abort is removed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINIDIST_", "PMI_", "OMPI_COMM_WORLD_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cli = [sys.executable, "-m", "minidist.cli", "run", "--transport", "mpi"]
    ok = subprocess.run(cli + ["-n", "2", str(ROOT / "examples" / "hello.py")], env=env,
                        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("the ring of 2 ranks added up to 1 (expected 1)") == 1, ok.stdout
    for rank in (0, 1):  # each rank's log lines, with its rank, as on shm and the pipe
        assert f"[rank {rank}] hello from rank {rank} of 2" in ok.stdout, ok.stdout
    script = tmp_path / "raises.py"
    script.write_text("import numpy as np\nimport minidist.distributed as dist\n"
                      "dist.init_process_group()\ndist.all_reduce(np.ones(4))\n"
                      "if dist.get_rank() == 1:\n    raise ValueError('boom on one')\n"
                      "dist.recv(np.empty(4), src=1)\n")
    before = segments_now()
    failed = subprocess.run(cli + ["-n", "3", str(script)], env=env, capture_output=True,
                            text=True, timeout=100, cwd=ROOT)
    assert failed.returncode != 0
    assert "rank 1 of 3 failed with ValueError: boom on one" in failed.stderr, failed.stderr
    assert _leftover(before) == set()
    wrong = subprocess.run(cli + ["-n", "2", "--trace", "t.jsonl", str(script)], env=env,
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert wrong.returncode != 0 and "MINIDIST_TRACE_DIR" in wrong.stderr


@needs_mpi
@pytest.mark.timeout(120)
def test_each_ranks_log_lines_are_shown_under_plain_mpiexec():
    """No minidist parent gathers the records of ranks mpiexec started: each
    rank prints its own, prefixed with its rank as `minidist run` prints
    them, rather than only its warnings (Python's default)."""
    result, _ = _run(ROOT / "examples" / "hello.py", 2, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for rank, said in ((0, "hello from rank 0 of 2"), (1, "hello from rank 1 of 2"),
                       (0, "started the ring"), (1, "received 0 from rank 0"),
                       (0, "got the total 1 back from rank 1")):
        assert any(f"[rank {rank}] {said}" in line for line in lines), result.stdout
    assert result.stdout.count("the ring of 2 ranks added up to 1 (expected 1)") == 1


# --------------------------------------------------------------------------- the same script on a cluster


@needs_mpi
@pytest.mark.timeout(120)
def test_a_sigkilled_rank_ends_the_job_and_minidist_run_names_it(tmp_path):
    """MPICH ends the job when a rank dies, naming a PID that is not always
    the dead rank's; ``minidist run --transport mpi`` names the rank whose
    process ended first (each rank holds a socket to it; see commands.py)."""
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group(timeout=600)
        dist.all_reduce(np.ones(8))
        if dist.get_rank() == 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.recv(np.empty(4), src=1)  # the others wait for rank 1 for good
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINIDIST_", "PMI_", "OMPI_COMM_WORLD_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = segments_now()
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "--transport", "mpi",
                             "-n", "3", str(script)], env=env, capture_output=True, text=True,
                            timeout=100, cwd=ROOT)
    seconds = time.perf_counter() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert _first_report(result.stderr).startswith("minidist: rank 1 (pid") and \
        "exited in the middle of the run" in result.stderr, output
    assert seconds < 10, f"{seconds:.1f} s to end the job:\n{output}"
    assert _leftover(before) == set()
    # Plain mpiexec ends it as fast (MPICH's own report, by PID).
    result, seconds = _run(script, 3, timeout=60)
    assert result.returncode != 0 and seconds < 10, (seconds, result.stdout + result.stderr)


@needs_mpi
@pytest.mark.timeout(120)
def test_minidist_launch_under_mpiexec_runs_on_the_jobs_ranks(tmp_path):
    """A script that calls minidist.launch runs unchanged under mpiexec: the
    function runs on the job's first world_size ranks over MPI, every rank gets
    every result, the trace is written; a launch bigger than the job runs on
    rank 0's machine with forked workers, and says so."""
    trace = tmp_path / "trace.jsonl"
    script = tmp_path / "launches.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        import minidist
        import minidist.distributed as dist
        from minidist import trace
        from minidist.distributed import world

        def step(x):
            a = np.full(3, float(dist.get_rank() + x))
            dist.all_reduce(a, algorithm="ring")
            return dist.get_rank(), dist.get_world_size(), world.current().transport.name, \\
                a.tolist()

        me = dist.get_rank() if dist.is_initialized() else int(
            __import__("os").environ.get("PMI_RANK") or
            __import__("os").environ["OMPI_COMM_WORLD_RANK"])
        two = minidist.launch(step, world_size=2, args=(1,), trace={str(trace)!r})
        assert two == [(0, 2, "mpi", [3.0] * 3), (1, 2, "mpi", [3.0] * 3)], two
        one = minidist.launch(step, world_size=1, args=(5,))
        assert one == [(0, 1, "mpi", [5.0] * 3)], one
        three = minidist.launch(step, world_size=3, args=(0,), transport="pipe")
        assert three == [(r, 3, "pipe", [3.0] * 3) for r in range(3)], three
        events = trace.read_jsonl({str(trace)!r}).events
        assert sorted({{e["rank"] for e in events}}) == [0, 1], events
        print(f"rank {{me}}: all launches agree", flush=True)
    """))
    result, _ = _run(script, 2, timeout=100)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert result.stdout.count("all launches agree") == 2, output
    assert "this launch asks for 3 ranks but mpiexec started 2" in result.stderr, output


@needs_mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("lesson", ["05_data_parallel", "09_pipeline"])
def test_lessons_run_unchanged_under_mpiexec(lesson, tmp_path):
    """Lessons 05 and 09, as they are, under mpiexec -n 2 (their quick form):
    their 2-rank launches run over MPI, their 4-rank ones on rank 0's machine."""
    result, _ = _run(ROOT / "lessons" / f"{lesson}.py", 2, timeout=360,
                     extra_env={"MINIDIST_LESSON_QUICK": "1",
                                "MINIDIST_LESSON_OUTPUT": str(tmp_path)})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    folder = tmp_path / lesson  # one folder per lesson
    pictures = sorted(path.name for path in folder.glob("*.png"))
    assert pictures, output[-3000:]
    # Rank 1 draws the same pictures into rank1/, never over rank 0's.
    assert sorted(path.name for path in (folder / "rank1").glob("*.png")) == pictures


@needs_mpi
@pytest.mark.timeout(120)
def test_a_collective_mismatch_is_named_under_mpiexec(tmp_path):
    """Rank 0 in an all_reduce, rank 1 in a broadcast: the message's tag says
    so (as on pipe and shm), the job ends at once with both calls named."""
    script = tmp_path / "mismatch.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group(timeout=300)
        a = np.ones(1000)
        if dist.get_rank() == 0:
            dist.all_reduce(a, algorithm="ring")
        else:
            dist.broadcast(a, src=0, algorithm="binomial")
    """))
    result, seconds = _run(script, 2, timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "collective mismatch: rank 1 is in broadcast (binomial, float64, src=0), call 0, but " \
           "rank 0 sent it a message of all_reduce (ring, SUM, float64)" in output, output
    assert seconds < 30, f"{seconds:.1f} s:\n{output}"


# --------------------------------------------------------------------------- the culprit first


def _first_report(stderr: str) -> str:
    """The first line minidist wrote (a rank's report or the launcher's), past
    warnings such as the oversubscription one."""
    return next((line for line in stderr.splitlines()
                 if line.startswith("minidist:") and not line.startswith("minidist: warning:")),
                "")


def _cli_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINIDIST_", "PMI_", "OMPI_COMM_WORLD_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def _minidist_run(script: Path, ranks: int, timeout: float):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "--transport", "mpi",
                             "-n", str(ranks), str(script)], env=_cli_env(),
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return result, time.perf_counter() - start


#: Rank 1 of 4 calls otherwise than ranks 0, 2 and 3: its split sizes
#: disagree with ranks 0 and 3's, or it reduces with MAX in call 2.
_ODD_CALLS = {
    "split sizes": ("""
send = [3, 2, 2, 1] if rank == 1 else [2, 2, 2, 2]
dist.all_to_all_single(np.zeros(8, np.float32), np.ones(8, np.float32),
                       output_split_sizes=[2, 2, 2, 2], input_split_sizes=send)
""", "minidist: rank 1 is the odd rank in call 0 of the world: its all_to_all_single sends 3 "
     "elements to rank 0, which expects 2; sends 1 element to rank 3, which expects 2."),
    "another reduction": ("""
x = np.ones(1000, np.float32)
for step in range(4):
    odd = rank == 1 and step == 2
    dist.all_reduce(x, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM, algorithm="ring")
""", "minidist: rank 1 is the odd rank in call 2 of the world: all_reduce (ring, MAX, float32) "
     "on rank 1; all_reduce (ring, SUM, float32) on ranks 0"),
}
#: How the reference's ranks may be listed: every other rank, or (under load)
#: the majority that had reached the call when the verdict was made, e.g.
#: "ranks 0 and 3": the odd rank is the same either way.
_MAJORITY = re.compile(r"on ranks 0(, 2)? and 3 \(most ranks\)\.")


@needs_mpi
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["mpiexec", "minidist run"])
@pytest.mark.parametrize("case", list(_ODD_CALLS))
def test_the_odd_rank_of_a_mismatch_is_named_first_under_mpi_every_time(case, launcher,
                                                                         tmp_path):
    """The ranks of one machine read each other's records, so the rank that
    notices names the odd rank (the group's verdict); its report began with
    itself ("rank 3 of 4 failed with CollectiveMismatchError: rank 1 is the
    odd rank ..."), another rank from run to run. Now the verdict comes first."""
    body, expected = _ODD_CALLS[case]
    script = tmp_path / "odd.py"
    script.write_text("import numpy as np\nimport minidist.distributed as dist\n\n"
                      "dist.init_process_group(timeout=60)\nrank = dist.get_rank()\n" + body)
    run = _run if launcher == "mpiexec" else _minidist_run
    for _ in range(3):
        result, seconds = run(script, 4, timeout=60)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output
        first = _first_report(result.stderr)
        assert first.startswith(expected), output
        if case == "another reduction":
            assert _MAJORITY.search(first), output
        assert seconds < 30, f"{seconds:.1f} s:\n{output}"
    _no_ranks_left(str(script))


#: Rank 1 leaves in the middle of a loop of all_reduces, in the way FAULT says.
_FAULTY_LOOP = """
import os, signal, sys
import numpy as np
import minidist.distributed as dist

dist.init_process_group(timeout={timeout})
for step in range(20):
    if dist.get_rank() == 1 and step == 3:
        {fault}
    dist.all_reduce(np.ones(1000))
print("rank", dist.get_rank(), "went through every step", flush=True)
"""


@needs_mpi
@pytest.mark.timeout(90)
def test_a_rank_that_os_exits_mid_collective_fails_the_run_naming_it(tmp_path):
    """MPICH returned 0 for about half of these runs, with no message: each
    rank now tells `minidist run` it finished; one that ended without saying
    so is named first, and the status is never 0."""
    script = tmp_path / "exits.py"
    script.write_text(_FAULTY_LOOP.format(timeout=20, fault="os._exit(0)"))
    before = segments_now()
    for attempt in range(5):
        result, seconds = _minidist_run(script, 3, timeout=30)
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"run {attempt}: status 0\n{output}"
        # The launcher's line, or a waiting rank's that saw rank 1's process gone first.
        first = _first_report(result.stderr)
        assert first.startswith("minidist: rank 1 ") and \
            "exited in the middle of the run" in first, output
        assert "went through every step" not in result.stdout, output
        assert seconds < 10, f"run {attempt}: {seconds:.1f} s\n{output}"
    assert _leftover(before) == set()
    _no_ranks_left(str(script))


@needs_mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["mpiexec", "minidist run"])
def test_an_early_return_under_mpi_names_the_rank_that_left(launcher, tmp_path):
    """Rank 1 ends its script while ranks 0 and 2 wait for it in all_reduce
    call 3: they see its record (shared by the ranks of a machine) say
    finished, and say so at once, rank 1 first, not after their timeout."""
    script = tmp_path / "leaves.py"
    script.write_text(_FAULTY_LOOP.format(timeout=15, fault="sys.exit(0)"))
    before = segments_now()
    if launcher == "mpiexec":
        result, seconds = _run(script, 3, timeout=60)
    else:
        result, seconds = _minidist_run(script, 3, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert _first_report(result.stderr).startswith(
        "minidist: rank 1 returned from its function (or ended its script) while rank "), output
    assert "call 3" in result.stderr or "recv from 1" in result.stderr, output
    assert seconds < 10, f"{seconds:.1f} s (the timeout is 15 s):\n{output}"
    assert _leftover(before) == set()
    _no_ranks_left(str(script))


@needs_mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["mpiexec", "minidist run"])
def test_a_frozen_rank_under_mpi_is_named_first(launcher, tmp_path):
    """Rank 1 stops itself (SIGSTOP) in the loop: at their timeout (3 s) the
    waiting ranks name it first, from its process state (T), not themselves;
    the stopped process is killed with the job."""
    result, seconds, output, before, script = _stopped_rank_run(launcher, tmp_path, 3, 60)
    assert _first_report(result.stderr).startswith("minidist: rank 1 is stopped (its process"), \
        output
    assert seconds < 12, f"{seconds:.1f} s:\n{output}"
    assert _leftover(before) == set()
    _no_ranks_left(str(script))


def _stopped_rank_run(launcher, tmp_path, rank_timeout, run_timeout):
    """Rank 1 of 3 stops itself (SIGSTOP) in the loop, the ranks' timeout
    ``rank_timeout``: (result, seconds, output, segments before, script)."""
    script = tmp_path / "stops.py"
    script.write_text(_FAULTY_LOOP.format(timeout=rank_timeout,
                                          fault="os.kill(os.getpid(), signal.SIGSTOP)"))
    before = segments_now()
    run = _run if launcher == "mpiexec" else _minidist_run
    result, seconds = run(script, 3, timeout=run_timeout)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    return result, seconds, output, before, script


@needs_mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["mpiexec", "minidist run"])
def test_a_stopped_rank_under_mpi_is_named_long_before_the_timeout(launcher, tmp_path):
    """Rank 1 stops itself (SIGSTOP) with a timeout of 60 s: the ranks of its
    machine waiting for it see its process state (T) for a few seconds
    (STOPPED_SECONDS, as on shared memory) and end the job then, naming it."""
    from minidist.runtime.stopped_ranks import STOPPED_SECONDS

    result, seconds, output, before, script = _stopped_rank_run(launcher, tmp_path, 60, 100)
    first = _first_report(result.stderr)
    assert first.startswith("minidist: rank 1 is stopped (its process") and \
        "has not progressed for" in first, output
    assert seconds < STOPPED_SECONDS + 20, f"{seconds:.1f} s (the timeout is 60 s):\n{output}"
    assert _leftover(before) == set()
    _no_ranks_left(str(script))


#: Rank 1 is stopped WHERE: "collective" (by rank 2, while rank 1 waits in
#: all_reduce call 3 for rank 0, which comes late), "after" (by itself, after
#: its last collective, while the others end their scripts) or "debugger" (a
#: debugger attaches while it sleeps before call 3; the test attaches one).
_STOPPED = """
import os, signal, time
from pathlib import Path
import numpy as np
import minidist.distributed as dist

WHERE = {where!r}
dist.init_process_group(timeout={timeout})
rank = dist.get_rank()
pids = [None] * dist.get_world_size()
dist.all_gather_object(pids, os.getpid())
for step in range(20):
    if step == 3 and WHERE == "collective":
        if rank == 0:
            time.sleep(1.0)
        if rank == 2:
            time.sleep(0.3)
            os.kill(pids[1], signal.SIGSTOP)
    if step == 3 and WHERE == "debugger" and rank == 1:
        Path(__file__).with_name("attach").write_text(str(os.getpid()))
        time.sleep(1.0)
    dist.all_reduce(np.ones(1000))
if WHERE == "after" and rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
print("rank", rank, "went through every step", flush=True)
"""


@needs_mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["mpiexec", "minidist run"])
@pytest.mark.parametrize("where", ["collective", "after"])
def test_a_rank_stopped_in_a_collective_or_after_its_last_is_named_within_seconds(
        where, launcher, tmp_path):
    """Stopped while it waits in a collective, its peers see it stopped (T)
    as they wait for it. Stopped after its last collective, no minidist wait
    is for it: the others' MPI_Finalize waited for it for ever (the job never
    ended, with a timeout of 60 s); now a rank whose script ended watches its
    machine's peers until they end theirs, and names one stopped for
    STOPPED_SECONDS."""
    from minidist.runtime.stopped_ranks import STOPPED_SECONDS

    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED.format(where=where, timeout=60))
    before = segments_now()
    run = _run if launcher == "mpiexec" else _minidist_run
    result, seconds = run(script, 3, timeout=100)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    first = _first_report(result.stderr)
    assert first.startswith("minidist: rank 1 is stopped (its process") and \
        "has not progressed for" in first, output
    if where == "after":
        assert "waits for it to end its script (MPI_Finalize waits for every rank)" in first
        assert result.stdout.count("went through every step") == 2, output
    assert seconds < STOPPED_SECONDS + 20, f"{seconds:.1f} s (the timeout is 60 s):\n{output}"
    assert _leftover(before) == set()
    _no_ranks_left(str(script))


@needs_mpi
@pytest.mark.skipif(not shutil.which("gdb"), reason="needs gdb, to attach a debugger")
@pytest.mark.timeout(120)
def test_a_rank_at_a_debuggers_stop_is_named_as_such_at_the_timeout(tmp_path):
    """A rank stopped by a debugger (state t) is not ended early (someone is
    at its breakpoint); at the others' timeout it is named first, as stopped
    by a debugger, not by SIGSTOP."""
    import threading

    script = tmp_path / "debugged.py"
    script.write_text(_STOPPED.format(where="debugger", timeout=5))
    attach, debuggers = tmp_path / "attach", []

    def attach_a_debugger():
        deadline = time.monotonic() + 60
        while not attach.exists() or not attach.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        debuggers.append(subprocess.Popen(
            ["gdb", "-p", attach.read_text(), "-batch", "-ex", "shell sleep 60"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    thread = threading.Thread(target=attach_a_debugger)
    thread.start()
    try:
        result, seconds = _run(script, 3, timeout=60)
    finally:
        thread.join()
        for debugger in debuggers:
            debugger.kill()
            debugger.wait()
    output = result.stdout + result.stderr
    assert debuggers, output
    assert result.returncode != 0, output
    assert _first_report(result.stderr).startswith(
        "minidist: rank 1 is stopped by a debugger or tracer (its process"), output
    assert "is in state t) and has not progressed for" in output, output
    _no_ranks_left(str(script))


@needs_mpi
@pytest.mark.timeout(120)
def test_cleaning_up_after_a_failed_run_spares_another_jobs_segments(tmp_path):
    """Another mpiexec job starts while a `minidist run --transport mpi` runs;
    the run fails (MPI_Abort leaves its segments): its clean-up removes its
    own segments and leaves the other job's alone."""
    go, started = tmp_path / "go", tmp_path / "started"
    failing = tmp_path / "fails.py"
    failing.write_text(textwrap.dedent(f"""
        import os, time
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group(timeout=60)
        dist.all_reduce(np.ones(8))
        if dist.get_rank() == 0:
            open({str(started)!r}, "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        if dist.get_rank() == 1:
            raise ValueError("boom beside another job")
        dist.recv(np.empty(4), src=1)
    """))
    other = tmp_path / "other_job.py"
    other.write_text("import sys, time\nfrom mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
                     "print('ready', flush=True)\ntime.sleep(60)\n")
    before = segments_now()
    run = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "--transport", "mpi",
                            "-n", "3", str(failing)], env=_cli_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 30
    while not started.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the other job starts while this one runs
    job = subprocess.Popen([_mpiexec(), "-n", "2", sys.executable, str(other)], env=_cli_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    theirs = JobSegments(job.pid)
    try:
        # Both ranks say ready; through mpiexec their lines may arrive joined.
        heard = ""
        while heard.count("ready") < 2:
            line = job.stdout.readline()
            assert line, heard
            heard += line
        theirs.look()
        assert theirs.seen, "the other job maps no MPICH segment: nothing to check"
        go.write_text("")
        _, err = run.communicate(timeout=60)
        assert run.returncode != 0
        assert "rank 1 of 3 failed with ValueError: boom beside another job" in err, err
        assert theirs.seen <= segments_now(), \
            f"the failed run removed the other job's {sorted(theirs.seen - segments_now())}"
        assert job.poll() is None, "the other job died"
    finally:
        for process in (run, job):
            if process.poll() is None:
                process.terminate()
            process.communicate(timeout=30)
        theirs.remove()  # ended by SIGTERM: its segments stay behind otherwise
    assert _leftover(before) == set()
    _no_ranks_left(str(failing))
    _no_ranks_left(str(other))


@needs_mpi
@pytest.mark.timeout(60)
def test_a_sigkilled_minidist_run_takes_its_mpi_job_with_it(tmp_path):
    """The launcher of ``minidist run --transport mpi`` killed outright: mpiexec
    gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and ends every rank, where
    it used to leave them running with no one to stop them; and the ranks,
    ended by SIGTERM, leave no MPICH segment behind (the launcher that would
    have removed them is dead)."""
    before = segments_now()
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleeps.py"
    script.write_text("import os, time\nimport minidist.distributed as dist\n"
                      "dist.init_process_group()\n"
                      f"open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
                      "time.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "--transport",
                                 "mpi", "-n", "2", str(script)], env=_cli_env(), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 40
    while len(os.listdir(pids)) < 2:
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.05)
    launcher.kill()
    launcher.wait()

    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as file:
                return file.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    ranks = [int(name) for name in os.listdir(pids)]
    deadline = time.monotonic() + 10
    while any(map(running, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in ranks if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the ranks outlived their SIGKILLed launcher"
    deadline = time.monotonic() + 5  # mpiexec's own processes end after the ranks
    while _leftover(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _leftover(before), "the SIGTERMed ranks left MPICH's shared memory behind"


@needs_mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_signalled_minidist_run_leaves_no_folder_behind(tmp_path, how):
    """SIGTERM to ``minidist run --transport mpi`` ends the job and cleans up
    as Ctrl-C does: its folder (the ranks' socket) removed, status 143, one
    line. A SIGKILLed one cannot; its folder is named after it, so the next
    run sees its launcher is dead and removes it."""
    import glob
    import tempfile

    before = segments_now()
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleeps.py"
    script.write_text("import os, time\nimport minidist.distributed as dist\n"
                      "dist.init_process_group()\n"
                      f"open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
                      "time.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "--transport",
                                 "mpi", "-n", "2", str(script)], env=_cli_env(), cwd=ROOT,
                                start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 40
    while len(os.listdir(pids)) < 2:
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()
        time.sleep(0.05)
    folders = os.path.join(tempfile.gettempdir(), f"minidist-mpi-{launcher.pid}-*")
    assert glob.glob(folders), "the run's folder carries the launcher's pid"
    launcher.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=20)
    if how == "sigterm":
        assert launcher.returncode == 143, stderr
        assert [line for line in stderr.splitlines() if line.strip()] == ["terminated"], stderr
        assert not glob.glob(folders)
    else:
        assert launcher.returncode == -signal.SIGKILL
        assert glob.glob(folders)  # nobody could remove it yet
        hello = tmp_path / "hello.py"
        hello.write_text("import minidist.distributed as dist\ndist.init_process_group()\n")
        after = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "--transport",
                                "mpi", "-n", "1", str(hello)], env=_cli_env(), cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert after.returncode == 0, after.stdout + after.stderr
        assert not glob.glob(folders), "the next run left the dead launcher's folder"
    _no_ranks_left(str(script))
    deadline = time.monotonic() + 5  # mpiexec's own processes end after the ranks
    while _leftover(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _leftover(before)


@needs_mpi
@pytest.mark.timeout(120)
def test_ranks_that_disagree_on_the_root_are_a_mismatch_under_mpi(tmp_path):
    """``broadcast(x, src=rank % 2)``: under MPI too a CollectiveMismatchError
    that names each side's root, not a silently wrong result."""
    script = tmp_path / "roots.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import minidist.distributed as dist

        dist.init_process_group(timeout=30)
        rank = dist.get_rank()
        x = np.full(3, float(rank * 10), np.float32)
        dist.broadcast(x, src=rank % 2)
        dist.barrier()
        print("rank", rank, "finished with", x.tolist(), flush=True)
    """))
    result, seconds = _run(script, 3, timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "CollectiveMismatchError" in output and "src=0" in output and "src=1" in output, \
        output
    assert "rank 2 finished" not in output, output
    assert seconds < 40, f"the job took {seconds:.1f} s to end:\n{output}"


def test_the_launcher_keeps_a_failed_ranks_headline_to_repeat(tmp_path):
    """A rank that fails sends its report's first line to `minidist run`
    before printing it; mpiexec's teardown can cut the printed report short
    (seen under load: a failed run with MPICH's banner and no minidist line),
    so the launcher keeps the line to say again at the end."""
    import socket

    from minidist.commands import _RankLines

    ended = []
    watcher = _RankLines(str(tmp_path / "ranks"), lambda rank, pid: ended.append(rank))
    failed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    failed.connect(watcher.path)
    failed.sendall(b"hello 0 101\nfailed\nreport rank 1 (pid 102) exited in the middle of the"
                   b" run (seen by rank 0 of 3)\n")
    vanished = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    vanished.connect(watcher.path)
    vanished.sendall(b"hello 1 102\n")
    time.sleep(0.3)  # "failed" is read before rank 1's line ends, as in the run that lost it
    failed.close()
    time.sleep(0.3)
    vanished.close()
    watcher.close()
    assert watcher.reports == ["rank 1 (pid 102) exited in the middle of the run "
                               "(seen by rank 0 of 3)"]
    assert watcher.culprit is None and ended == []  # rank 0 reported it: no second culprit
    assert watcher.vanished == [(1, 102)]
