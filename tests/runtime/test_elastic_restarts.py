"""`minidist run --max-restarts K -n MIN:MAX`: elastic restarts, and resuming from a checkpoint.

The runs train examples/elastic_training.py (a float64 MLP under DDP, 30
steps, a checkpoint every 10) and kill a rank on the first attempt. Each run
checks what the launcher leaves: no shared-memory segment named after it in
/dev/shm, no rank process alive.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minidist.runtime import restarts
from minidist.runtime.segments import creator_prefix

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_training.py")


def minidist_run(*arguments, timeout=90):
    """``minidist run ...``; also checks that the run left no segment and no rank."""
    process = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", *arguments],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"minidist run {' '.join(arguments)} ran past {timeout} s:\n{err}") \
            from None
    left = [name for name in os.listdir("/dev/shm")
            if name.startswith(creator_prefix(process.pid))]
    assert not left, f"segments left in /dev/shm: {left}"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def ranks_left(times) -> list[int]:
    with open(times) as file:
        pids = [json.loads(line)["pid"] for line in file if '"start"' in line]
    assert pids, "no rank noted its start"
    return [pid for pid in pids if alive(pid)]


def train(tmp_path, name, *launcher, **options):
    """A run of the example; returns (the finished process, the final weights or None)."""
    out, times = tmp_path / f"{name}.npz", tmp_path / f"{name}.times"
    script = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    done = minidist_run(*launcher, EXAMPLE, *script, f"--out={out}", f"--times={times}")
    assert not ranks_left(times)
    weights = dict(np.load(out)) if out.exists() else None
    return done, weights


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """Unbroken runs on 2 and 3 ranks: {world size: weights}."""
    tmp = tmp_path_factory.mktemp("unbroken")
    found = {}
    for world in (2, 3):
        done, weights = train(tmp, f"unbroken{world}", "-n", str(world))
        assert done.returncode == 0, done.stderr
        found[world] = weights
    return found


@pytest.mark.timeout(120)
def test_a_restart_on_the_same_size_gives_the_unbroken_weights_bit_for_bit(unbroken, tmp_path):
    done, weights = train(tmp_path, "restarted", "--max-restarts", "1", "-n", "2",
                          kill_rank=1, kill_step=13)
    assert done.returncode == 0, done.stderr
    assert ("attempt 1 of 2 failed (rank 1 was killed by SIGKILL" in done.stderr
            and "restarting on 2 ranks (restart 1 of 1)" in done.stderr), done.stderr
    assert "resumed at step 10 from checkpoint of step 10; 3 steps lost" in done.stdout
    for key in unbroken[2]:
        assert np.array_equal(weights[key], unbroken[2][key]), key


@pytest.mark.timeout(120)
def test_a_lost_rank_shrinks_the_next_attempt_and_the_weights_agree_to_rounding(unbroken,
                                                                                 tmp_path):
    done, weights = train(tmp_path, "shrunk", "--max-restarts", "2", "-n", "2:3",
                          kill_rank=2, kill_step=17, fault="lost")
    assert done.returncode == 0, done.stderr
    assert "1 lost (rank 2); restarting on 2 ranks (restart 1 of 2)" in done.stderr, done.stderr
    assert ("attempt 2 (restart 1) on 2 ranks: resumed at step 10 from checkpoint of step 10; "
            "7 steps lost") in done.stdout
    assert "equal within rtol 1e-9: yes" in done.stdout
    for world in (2, 3):   # steps 0-9 on 3 ranks, 10-29 on 2: neither run's sums exactly
        for key in weights:
            np.testing.assert_allclose(weights[key], unbroken[world][key], rtol=1e-9, atol=0)


@pytest.mark.timeout(120)
def test_a_kill_inside_a_save_leaves_the_last_whole_checkpoint(unbroken, tmp_path):
    import minidist.distributed.checkpoint as dcp
    from minidist.distributed.checkpoint.state_dict import get_state_dict

    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import elastic_training
    finally:
        sys.path.pop(0)
    folder = tmp_path / "checkpoints"
    # Rank 0 writes the replicated arrays (dcp writes a replica once, by its lowest rank).
    done, _ = train(tmp_path, "cut", "-n", "2", kill_rank=0, kill_step=20, fault="save",
                    checkpoint_dir=folder)
    assert done.returncode == 1 and "rank 0 was killed by SIGKILL" in done.stderr
    assert sorted(name for name in os.listdir(folder) if name.startswith("step_")) == \
        ["step_00000010"], os.listdir(folder)
    model, optimizer = elastic_training.build(16)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd, "progress": {"step": 0, "extra": {}}},
             checkpoint_id=folder / "step_00000010", no_dist=True)
    # Started again by hand on the same folder: it resumes, and ends as the unbroken run.
    done, weights = train(tmp_path, "again", "-n", "2", checkpoint_dir=folder)
    assert done.returncode == 0, done.stderr
    assert "resumed at step 10 from checkpoint of step 10; 10 steps lost" in done.stdout
    assert not [name for name in os.listdir(folder) if name.endswith(".tmp")]
    for key in unbroken[2]:
        assert np.array_equal(weights[key], unbroken[2][key]), key


@pytest.mark.timeout(120)
def test_another_models_checkpoint_is_refused_in_one_line_and_not_restarted(tmp_path):
    folder = tmp_path / "checkpoints"
    done, _ = train(tmp_path, "small", "-n", "2", checkpoint_dir=folder, steps=10)
    assert done.returncode == 0, done.stderr
    done, _ = train(tmp_path, "wide", "--max-restarts", "3", "-n", "2", checkpoint_dir=folder,
                    width=32)
    assert done.returncode == 1
    line = next(line for line in done.stderr.splitlines()
                if "CheckpointMismatchError: elastic resume:" in line)
    assert "was saved from another model" in line and \
        "0.weight saved (16, 8), this model (32, 8)" in line and "start from step 0" in line
    assert "asked for no restart (mark_no_restart); giving up" in done.stderr
    assert "restarting" not in done.stderr


SCRIPT = textwrap.dedent("""
    import json, os, sys
    import minidist.distributed as dist
    from minidist.runtime.errors import WorkerError
    from minidist.runtime import restarts
    dist.init_process_group()
    rank, attempt = dist.get_rank(), restarts.restart_count()
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID")
    print(json.dumps({name: os.environ[name] for name in names}), flush=True)
    mode = sys.argv[1]
    if len(sys.argv) > 2 and rank == 0:   # the launcher's segments as this attempt sees them
        prefix = f"minidist_{os.getppid()}_"
        with open(os.path.join(sys.argv[2], f"segments{attempt}"), "w") as file:
            json.dump([n for n in os.listdir("/dev/shm") if n.startswith(prefix)], file)
    dist.barrier()
    if mode == "always" and rank == 1:
        raise RuntimeError("this rank always fails")
    if mode == "once" and rank == 1 and attempt == 0:
        raise RuntimeError("this rank fails on the first attempt")
    if mode == "two-lost" and attempt == 0 and rank > 0:
        restarts.mark_rank_lost()
        os._exit(restarts.LOST_EXIT_CODE if rank == 2 else 1)
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "ranks.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.mark.timeout(60)
def test_the_script_sees_torchruns_names_on_every_attempt(script, tmp_path):
    path = tmp_path / "run.jsonl"
    done = minidist_run("--max-restarts", "2", "-n", "3", "--transport", "pipe", "--trace",
                        str(path), script, "once", str(tmp_path))
    assert done.returncode == 0, done.stderr
    # (the ranks share one stdout: a line may be cut by another rank's)
    seen = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", done.stdout)]
    assert len(seen) == 6
    assert {entry["TORCHELASTIC_RUN_ID"] for entry in seen} and \
        len({entry["TORCHELASTIC_RUN_ID"] for entry in seen}) == 1
    for attempt in (0, 1):
        mine = [e for e in seen if e["TORCHELASTIC_RESTART_COUNT"] == str(attempt)]
        assert sorted(e["RANK"] for e in mine) == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in mine} == {"3"}
        assert {e["TORCHELASTIC_MAX_RESTARTS"] for e in mine} == {"2"}
    assert "attempt 2 of 3 succeeded on 3 ranks" in done.stderr
    # Each attempt has a fresh control block: the first's were gone before the second began.
    first, second = (set(json.loads((tmp_path / f"segments{n}").read_text())) for n in (0, 1))
    assert first and second and not first & second


def test_the_trace_holds_every_attempt_and_the_timeline_draws_the_restart(script, tmp_path):
    from minidist import trace
    from viz.timeline import draw_timeline

    path = tmp_path / "run.jsonl"
    done = minidist_run("--max-restarts", "1", "-n", "2", "--trace", str(path), script, "once")
    assert done.returncode == 0, done.stderr
    recorded = trace.read_jsonl(path)
    assert [(a["attempt"], a["world_size"]) for a in recorded.header["attempts"]] == [(0, 2), (1, 2)]
    assert recorded.header["attempts"][0]["outcome"].startswith("rank 1 failed with RuntimeError")
    assert {event["attempt"] for event in recorded.events} == {0, 1}
    for send, recv in trace.iter_messages(recorded.events):   # never across attempts
        assert recv is None or recv["attempt"] == send["attempt"]
    axis = draw_timeline(recorded).axes[0]
    dashed = [line for line in axis.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1
    assert any("attempt 2 (restart 1, 2 ranks)" in text.get_text() for text in axis.texts)


@pytest.mark.timeout(60)
def test_a_spent_budget_ends_the_run_with_one_line(script):
    done = minidist_run("--max-restarts", "1", "-n", "2", script, "always")
    assert done.returncode == 1
    assert done.stderr.count("rank 1 failed with RuntimeError: this rank always fails") >= 2
    assert done.stderr.strip().splitlines()[-1] == (
        "minidist run: rank 1 failed again and the 1 restart of --max-restarts 1 is spent; "
        "giving up")


@pytest.mark.timeout(60)
def test_below_the_minimum_the_run_gives_up_with_one_line(script):
    # rank 1 marks itself lost, rank 2 exits with the lost status: both count.
    done = minidist_run("--max-restarts", "3", "-n", "2:3", script, "two-lost")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "minidist run: 1 rank left, below the minimum of 2 (-n 2:3); giving up")


def test_the_decisions_in_words():
    policy = restarts.RestartPolicy(2, 4, 3)
    assert policy.decide(4, 2, "rank 2 was killed by SIGKILL") == (
        4, "attempt 1 of 4 failed (rank 2 was killed by SIGKILL); restarting on 4 ranks "
           "(restart 1 of 3)")
    assert policy.decide(4, 1, "rank 1 exited", lost={1})[0] == 3
    assert policy.decide(3, 0, "x", no_restart={0})[0] is None
    policy.restarts = 3
    assert policy.decide(3, 1, "x") == (
        None, "rank 1 failed again and the 3 restarts of --max-restarts 3 are spent; giving up")
    assert restarts.parse_sizes("2:4") == (2, 4) and restarts.parse_sizes("3") == (3, 3)
    for wrong in ("4:2", "0", "a:b", "1:2:3"):
        with pytest.raises(ValueError, match="MIN:MAX"):
            restarts.parse_sizes(wrong)


def test_a_range_without_restarts_is_refused_in_one_line(script):
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2:4", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "is for elastic runs: add --max-restarts K" in done.stderr


def test_every_world_size_trains_on_the_same_global_batches():
    from minidist.parallel.resilience import GlobalBatchSampler

    sampler = GlobalBatchSampler(100, 12, seed=3)
    for step in (0, 7, 8, 9, 30):       # 8 batches an epoch: 8 and 30 are in later epochs
        whole = sampler.global_indices(step)
        assert len(whole) == 12 and len(set(whole)) == 12
        for world in (1, 2, 3, 4, 5):
            pieces = [sampler.local_batch(step, rank, world) for rank in range(world)]
            assert np.array_equal(np.concatenate(pieces), whole)
    first_epoch = np.concatenate([sampler.global_indices(s) for s in range(8)])
    assert len(set(first_epoch)) == 96


@pytest.mark.timeout(60)
def test_launch_restarts_a_function_with_the_restart_count():
    import minidist
    import minidist.distributed as dist
    from minidist.runtime.errors import WorkerError

    def fn():
        count = int(os.environ[restarts.RESTART_COUNT])
        if count < 2 and dist.get_rank() == 1:
            raise RuntimeError(f"failing on attempt {count}")
        return count

    assert minidist.launch(fn, 2, max_restarts=2) == [2, 2]
    assert restarts.RESTART_COUNT not in os.environ
    with pytest.raises(WorkerError, match="failing on attempt 1"):
        minidist.launch(fn, 2, max_restarts=1)


@pytest.mark.timeout(180)
def test_the_chaos_script_recovers_from_every_fault_on_both_transports():
    """scripts/chaos_elastic.py, once per fault and transport (twice took about
    45 s on two loaded cores; once, half that)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "chaos_elastic.py"),
                           "--each", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 runs, 0 with problems" in done.stdout
