"""A torch.distributed script ported line by line: the names it reaches for
around the collectives compute what torch's do, or are refused with a
clear error.

``dist.is_available``, ``group.WORLD`` / ``GroupMember``, ``Backend``,
``get_process_group_ranks``, ``new_subgroups``, ``is_torchelastic_launched``,
``Work.is_completed`` (collectives and point-to-point) and
``DistributedSampler(dataset)`` reading the default group. One launch per
world size runs the whole script; the parent checks each answer against
torch's documented behaviour.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.data import DistributedSampler


def _error(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _script():
    assert dist.is_available()
    dist.init_process_group(backend=dist.Backend.GLOO)   # launch initialized it: a no-op
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {"elastic": dist.is_torchelastic_launched()}

    world = dist.group.WORLD
    out["WORLD is the default group"] = (world is dist.GroupMember.WORLD
                                         and world is dist.world_group())
    out["world ranks"] = dist.get_process_group_ranks(world)
    out["None ranks"] = dist.get_process_group_ranks(None)
    x = np.full(3, rank + 1.0)
    dist.all_reduce(x, group=dist.group.WORLD)
    out["all_reduce on group.WORLD"] = x
    y = np.full(2, float(rank))
    dist.broadcast(y, src=n - 1, group=dist.GroupMember.WORLD)
    out["broadcast on GroupMember.WORLD"] = y
    out["rank and size of WORLD"] = (dist.get_rank(world), dist.get_world_size(world))

    # Subgroups of two, consecutive ranks, as torch cuts them.
    pair, pairs = dist.new_subgroups(group_size=2)
    out["pairs"] = [dist.get_process_group_ranks(g) for g in pairs]
    out["my pair"] = dist.get_process_group_ranks(pair)
    z = np.array([rank], np.int64)
    dist.all_reduce(z, group=pair)
    out["sum in my pair"] = int(z[0])
    # The default size: the ranks on this machine, every rank under launch.
    machine, machines = dist.new_subgroups()
    out["default subgroups"] = [dist.get_process_group_ranks(g) for g in machines]
    out["default is mine"] = machine is machines[0]
    mine, listed = dist.new_subgroups_by_enumeration([[0], list(range(1, n))])
    out["enumerated"] = (dist.get_process_group_ranks(mine), len(listed))

    odd = dist.new_group(list(range(1, n, 2)))
    out["odd != NON_GROUP_MEMBER"] = odd != dist.GroupMember.NON_GROUP_MEMBER
    out["odd == NON_GROUP_MEMBER"] = odd == dist.GroupMember.NON_GROUP_MEMBER
    out["world == NON_GROUP_MEMBER"] = world == dist.GroupMember.NON_GROUP_MEMBER
    try:
        single, _ = dist.new_subgroups(group_size=1, group=odd)
        out["subgroups of odd"] = dist.get_process_group_ranks(single)
    except ValueError as error:
        out["subgroups of odd"] = str(error)

    out["errors"] = {
        "not divisible": _error(lambda: dist.new_subgroups(group_size=n + 1 if n > 2 else 3)),
        "zero": _error(lambda: dist.new_subgroups(group_size=0)),
        "overlap": _error(lambda: dist.new_subgroups_by_enumeration([[0, 1], [1]])),
        "empty": _error(lambda: dist.new_subgroups_by_enumeration([])),
    }
    if n == 4:
        out["errors"]["3 of 4"] = _error(lambda: dist.new_subgroups(group_size=3))

    # is_completed: a collective's Work and a point-to-point request.
    big = np.full(1 << 16, float(rank), np.float32)
    work = dist.all_reduce(big, async_op=True)
    polls = 0
    while not work.is_completed():
        polls += 1
    out["async all_reduce"] = (work.is_completed(), float(big[0]))
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = np.zeros(4, np.int64)
    requests = [dist.irecv(incoming, left), dist.isend(np.full(4, rank, np.int64), right)]
    while not all(request.is_completed() for request in requests):
        pass
    out["ring by isend/irecv"] = (all(isinstance(r, dist.Work) for r in requests),
                                  incoming.tolist())

    # DistributedSampler without num_replicas and rank: the default group's.
    sampler = DistributedSampler(list(range(10)), shuffle=False)
    out["sampler"] = (sampler.num_replicas, sampler.rank, list(sampler))
    sampler.set_epoch(3)
    explicit = DistributedSampler(10, num_replicas=n, rank=rank, seed=5)
    implicit = DistributedSampler(10, seed=5)
    explicit.set_epoch(2)
    implicit.set_epoch(2)
    out["sampler same as explicit"] = list(implicit) == list(explicit)
    return out


@pytest.mark.parametrize("transport, world_size", [("pipe", 2), ("shm", 4)])
def test_a_ported_script_gets_torch_s_answers(transport, world_size):
    n = world_size
    results = minidist.launch(_script, world_size=n, transport=transport, timeout=60)
    total = sum(range(1, n + 1))
    for rank, out in enumerate(results):
        assert out["elastic"] is False
        assert out["WORLD is the default group"]
        assert out["world ranks"] == out["None ranks"] == list(range(n))
        np.testing.assert_array_equal(out["all_reduce on group.WORLD"], np.full(3, total))
        np.testing.assert_array_equal(out["broadcast on GroupMember.WORLD"],
                                      np.full(2, n - 1.0))
        assert out["rank and size of WORLD"] == (rank, n)
        assert out["pairs"] == [[i, i + 1] for i in range(0, n, 2)]
        first = rank - rank % 2
        assert out["my pair"] == [first, first + 1]
        assert out["sum in my pair"] == 2 * first + 1
        assert out["default subgroups"] == [list(range(n))] and out["default is mine"]
        assert out["enumerated"] == (([0] if rank == 0 else list(range(1, n))), 2)
        is_odd = rank % 2 == 1
        assert out["odd != NON_GROUP_MEMBER"] is is_odd
        assert out["odd == NON_GROUP_MEMBER"] is (not is_odd)
        assert out["world == NON_GROUP_MEMBER"] is False
        if is_odd:
            assert out["subgroups of odd"] == [rank]
        else:
            assert f"rank {rank} is not in the group it cut into subgroups" in \
                out["subgroups of odd"]
        errors = out["errors"]
        assert "must be divisible by group_size=3" in errors["not divisible"] or \
            "must not exceed the world size" in errors["not divisible"]
        assert "must be a positive int" in errors["zero"]
        assert "rank 1 has appeared in both subgroup [0, 1] and [1]" in errors["overlap"]
        assert "cannot be empty" in errors["empty"]
        if n == 4:
            assert "world size (4) must be divisible by group_size=3" in errors["3 of 4"]
        for message in errors.values():
            assert message.startswith("ValueError")
        assert out["async all_reduce"] == (True, float(sum(range(n))))
        assert out["ring by isend/irecv"] == (True, [(rank - 1) % n] * 4)
        expected = list(range(10)) + list(range(10))[: -(-10 // n) * n - 10]
        assert out["sampler"] == (n, rank, expected[rank::n])
        assert out["sampler same as explicit"]


def test_names_before_init_and_backend_as_torch_spells_it(monkeypatch):
    assert dist.is_available() is True
    # Before init torch's group.WORLD is None too (this pytest process may have
    # initialized a world of one in an earlier test: then it is that world).
    default = dist.world_group() if dist.is_initialized() else None
    assert dist.group.WORLD is default and dist.GroupMember.WORLD is default
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert dist.is_torchelastic_launched() is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert dist.is_torchelastic_launched() is True
    assert dist.Backend.GLOO == "gloo" and dist.Backend.NCCL == "nccl"
    assert dist.Backend.MPI == "mpi" and dist.Backend.UCC == "ucc"
    assert dist.Backend("GLOO") == "gloo" and isinstance(dist.Backend("shm"), str)
    assert dist.Backend("Pipe") == dist.Backend.PIPE
    with pytest.raises(ValueError, match="cannot load another"):
        dist.Backend("fancy")
    with pytest.raises(ValueError, match="a string"):
        dist.Backend(3)
    sentinel = dist.GroupMember.NON_GROUP_MEMBER
    assert sentinel == sentinel and not (sentinel != sentinel)
    assert sentinel != object() and sentinel != -100
