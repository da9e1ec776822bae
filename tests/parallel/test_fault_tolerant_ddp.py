"""Fault-tolerant data parallel (torchft's Manager): a replica lost at a step,
the group going on at 3 of 4, the spare joining, and every rank's weights,
step by step, equal to one process replaying the recorded quorums.

World 5 (replicas 0-3, rank 4 a hot spare), on pipe and shm; each failure
kind of :mod:`minidist.parallel.resilience.faults`, before the all_reduce
and inside it (the rank dies after its first messages).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.parallel.resilience import (
    MPI_REFUSAL,
    Manager,
    RegressionProblem,
    ReplicaFault,
    decide,
    replay,
    train,
)
from minidist.parallel.resilience.quorum import COLUMNS, FRESH, HOLDER, SPARE, QuorumRow

PROBLEM = RegressionProblem(steps=7)


def _run(transport, fault=None, problem=PROBLEM, world_size=5, replicas=4):
    return minidist.launch(train, world_size=world_size, transport=transport,
                           args=(problem, replicas, fault), tolerate_failures=True, timeout=60)


def _check_against_replay(results, problem, failed=()):
    # A spare that never joined holds nothing to compare.
    survivors = [r for rank, r in enumerate(results)
                 if rank not in failed and r[0].role != "spare"]
    for rank in failed:
        assert isinstance(results[rank], dist.WorkerError), results[rank]
    histories = [result.history for result, _ in survivors]
    reference = replay(problem, histories[0])
    assert [record.step for record in histories[0]] == list(range(problem.steps))
    for (result, weights), history in zip(survivors, histories):
        assert result.committed == problem.steps
        # A spare that joined holds the history it received, the same records.
        assert history == histories[0], f"rank {result.rank}'s quorums differ from rank 0's"
        assert weights, f"rank {result.rank} applied no step"
        for step, arrays in weights.items():
            for got, want in zip(arrays, reference[step]):
                np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12,
                                           err_msg=f"rank {result.rank}, step {step}")
    return histories[0], survivors


# -- the quorum's rule, without processes --------------------------------

def _rows(world, **by_rank):
    rows = np.zeros((world, COLUMNS), np.int64)
    for rank, row in by_rank.items():
        rows[int(rank[1:])] = row.as_row(world)
    return rows


def test_the_first_quorum_heals_every_replica_from_the_lowest():
    rows = _rows(5, r0=QuorumRow(FRESH), r1=QuorumRow(FRESH), r2=QuorumRow(FRESH),
                 r3=QuorumRow(FRESH), r4=QuorumRow(SPARE))
    quorum = decide(rows, replicas=4, total_steps=5)
    assert (quorum.quorum_id, quorum.members, quorum.joining, quorum.source) == \
        (1, (0, 1, 2, 3), (1, 2, 3), 0)
    assert quorum.spares == (4,) and not quorum.done


def test_a_lost_replica_gives_a_short_quorum_then_the_spare_joins():
    full = (0, 1, 2, 3)
    rows = _rows(5, r0=QuorumRow(HOLDER, 3, 1, 0, full), r1=QuorumRow(HOLDER, 3, 1, 0, full),
                 r3=QuorumRow(HOLDER, 3, 1, 0, full), r4=QuorumRow(SPARE))
    short = decide(rows, replicas=4, total_steps=5)
    assert (short.quorum_id, short.members, short.joining) == (2, (0, 1, 3), ())
    later = _rows(5, r0=QuorumRow(HOLDER, 4, 2, 1, (0, 1, 3)),
                  r1=QuorumRow(HOLDER, 4, 2, 1, (0, 1, 3)),
                  r3=QuorumRow(HOLDER, 4, 2, 1, (0, 1, 3)), r4=QuorumRow(SPARE))
    joined = decide(later, replicas=4, total_steps=5)
    assert (joined.quorum_id, joined.members, joined.joining, joined.source) == \
        (3, (0, 1, 3, 4), (4,), 0)


def test_replicas_ahead_by_a_step_roll_it_back():
    full = (0, 1, 2, 3)
    rows = _rows(4, r0=QuorumRow(HOLDER, 4, 1, 0, full), r1=QuorumRow(HOLDER, 3, 1, 0, full),
                 r3=QuorumRow(HOLDER, 4, 1, 0, full))
    quorum = decide(rows, replicas=4, total_steps=4)
    assert quorum.step == 3 and quorum.rollback == (0, 3) and not quorum.done


def test_no_replica_with_the_weights_left_is_said():
    rows = _rows(5, r4=QuorumRow(SPARE, 0, 2))
    with pytest.raises(dist.PeerGoneError, match="every replica that held the weights"):
        decide(rows, replicas=4, total_steps=5)


# -- on processes ---------------------------------------------------------

@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_without_a_fault_it_is_data_parallel(transport):
    problem = RegressionProblem(steps=4, optimizer="adamw", lr=0.01)
    results = _run(transport, problem=problem)
    history, _ = _check_against_replay(results, problem)
    assert all(record.members == (0, 1, 2, 3) for record in history)
    assert results[4][0].role == "spare" and results[4][0].committed == 0


FAULTS = [("raise", "compute"), ("sigkill", "compute"), ("exit", "compute"),
          ("sigstop", "compute"), ("sigkill", "allreduce")]


@pytest.mark.parametrize("transport", ["pipe", "shm"])
@pytest.mark.parametrize("kind,where", FAULTS)
def test_a_lost_replica_and_the_spare_that_replaces_it(transport, kind, where):
    lost, at = 2, 3
    results = _run(transport, ReplicaFault(lost, at, kind, where))
    history, survivors = _check_against_replay(results, PROBLEM, failed=(lost,))
    members = [record.members for record in history]
    assert members[:at] == [(0, 1, 2, 3)] * at
    assert members[at] == (0, 1, 3), "the failed step is redone at 3 of 4"
    assert members[at + 1:] == [(0, 1, 3, 4)] * (PROBLEM.steps - at - 1), "the spare joined"
    for result, _ in survivors:
        if result.rank != 4:
            assert any(f"replica rank {lost} " in event for event in result.events), \
                result.events
    # The step in flight was not applied anywhere: the first quorum failed it.
    attempts = survivors[0][0].attempts
    assert [a.outcome for a in attempts if a.step == at] == ["failed", "committed"]


def test_a_death_inside_the_all_reduce_applies_no_step_twice():
    """The rank dies between its messages: a neighbour may complete the
    all_reduce and apply the step, and must undo it (the replay checks)."""
    results = _run("pipe", ReplicaFault(1, 2, "sigkill", "allreduce"),
                   problem=RegressionProblem(steps=5, optimizer="adamw", lr=0.02))
    history, survivors = _check_against_replay(
        results, RegressionProblem(steps=5, optimizer="adamw", lr=0.02), failed=(1,))
    assert [record.step for record in history] == list(range(5))


def test_under_mpi_it_is_refused_in_one_line(monkeypatch):
    """The mpi transport is selected only under mpiexec; its name stands in
    for it here, as dist.get_backend() would say it."""
    import minidist.parallel.resilience.fault_tolerant_ddp as ftdp

    monkeypatch.setattr(ftdp.dist, "get_backend", lambda group=None: "mpi")
    with pytest.raises(RuntimeError) as error:
        ftdp.refuse_mpi()
    assert str(error.value) == MPI_REFUSAL and "\n" not in MPI_REFUSAL
    assert "ULFM" in MPI_REFUSAL and "'pipe' or 'shm'" in MPI_REFUSAL
    assert Manager  # the manager calls refuse_mpi() first


def test_the_chaos_script_briefly(capsys):
    """One run of each fault on each transport: finished right or ended
    naming the culprit, nothing left behind (the full run: --runs 50)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "chaos_ftdp.py"
    spec = importlib.util.spec_from_file_location("chaos_ftdp", path)
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    assert chaos.main(["--runs", "1", "--steps", "4"]) == 0, capsys.readouterr().out
    table = capsys.readouterr().out
    assert "nothing left behind" in table and table.count(" 1 ") >= 8


def test_each_quorum_change_is_an_event_of_the_trace(tmp_path):
    from minidist import trace

    path = tmp_path / "ftdp.jsonl"
    minidist.launch(train, world_size=5, transport="shm",
                    args=(RegressionProblem(steps=4), 4, ReplicaFault(3, 1, "raise")),
                    tolerate_failures=True, timeout=60, trace=path)
    events = trace.read_jsonl(path).events
    changes = [trace.label_info(e["label"]) for e in events
               if e["kind"] == "quorum" and e["label"].startswith("quorum change")
               and e["rank"] == 0]
    assert [(c["quorum"], c["step"], c["members"]) for c in changes] == \
        [(1, 0, "0,1,2,3"), (2, 1, "0,1,2"), (3, 2, "0,1,2,4")]
    assert any(e["kind"] == "recovery" and e["rank"] == 4 for e in events)
