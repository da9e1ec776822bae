"""``src=`` / ``dst=`` mean what they mean in torch.distributed: a GLOBAL rank,
on every group. A script ported line by line from torch computes the same
values, or is refused with one line that names the group's members.

torch's documentation (``torch.distributed.broadcast`` and the rest):
"src (int): Source rank on global process group (regardless of group
argument)", "group_src (int): Source rank on group. Must specify one of
group_src and src but not both"; ``get_rank`` / ``get_world_size`` return -1
on a process that is not in the group; ``recv`` returns the sender's global
rank. Every case below is written as a torch user writes it; one launch per
transport runs all of them on 4 ranks and the parent compares each result
with what those sentences say.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist


def _refusal(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _ported_script():
    rank = dist.get_rank()
    out = {}
    # Every rank makes every group, in the same order, as torch requires.
    pair = dist.new_group([1, 2])
    odd = dist.new_group([1, 3])
    three = dist.new_group([1, 2, 3])
    low_high = dist.new_group([0, 2])

    # The example of torch's group semantics: src is the global rank 1, whose
    # data is broadcast.
    if rank in (1, 2):
        x = np.full(3, 10.0 * rank)
        dist.broadcast(x, src=1, group=pair)
        out["broadcast src=1"] = x.tolist()
        y = np.full(3, 10.0 * rank)
        dist.broadcast(y, group=pair, group_src=1)  # the group's rank 1 is global 2
        out["broadcast group_src=1"] = y.tolist()
        out["refused: src not in group"] = _refusal(
            lambda: dist.broadcast(np.zeros(3), src=0, group=pair))
        out["refused: both"] = _refusal(
            lambda: dist.broadcast(np.zeros(3), src=1, group=pair, group_src=0))
        out["refused: group_src out of range"] = _refusal(
            lambda: dist.broadcast(np.zeros(3), group=pair, group_src=2))
    out["rank, size in pair"] = (dist.get_rank(pair), dist.get_world_size(pair))

    # reduce to a global rank of a 3-rank group; gather and scatter likewise.
    if rank in (1, 2, 3):
        total = np.full(2, float(rank))
        dist.reduce(total, dst=2, group=three)
        out["reduce dst=2"] = total.tolist()
        total = np.full(2, float(rank))
        dist.reduce(total, group=three, group_dst=2)  # global 3
        out["reduce group_dst=2"] = total.tolist()
        gathered = [np.zeros(1) for _ in range(3)] if rank == 3 else None
        dist.gather(np.array([float(rank)]), gathered, dst=3, group=three)
        if rank == 3:
            out["gather dst=3"] = [float(a[0]) for a in gathered]
        piece = np.zeros(1)
        pieces = [np.array([100.0 + r]) for r in range(3)] if rank == 2 else None
        dist.scatter(piece, pieces, src=2, group=three)
        out["scatter src=2"] = float(piece[0])

    # The object collectives.
    if rank in (0, 2):
        objects = [f"from {rank}", rank] if rank == 2 else [None, None]
        dist.broadcast_object_list(objects, src=2, group=low_high)
        out["broadcast_object_list src=2"] = objects
        into = [None, None] if rank == 2 else None
        dist.gather_object({"r": rank}, into, dst=2, group=low_high)
        if rank == 2:
            out["gather_object dst=2"] = into
        mine = [None]
        dist.scatter_object_list(mine, ["a", "b"] if rank == 2 else None, src=2,
                                 group=low_high)
        out["scatter_object_list src=2"] = mine[0]

    # Point to point inside a group, by global ranks.
    if rank in (1, 3):
        if rank == 1:
            dist.send(np.array([11.0]), dst=3, group=odd)
            dist.send(np.array([12.0]), group=odd, group_dst=1)
            request = dist.isend(np.array([13.0]), dst=3, group=odd, tag=4)
            request.wait()
            dist.send_object_list(["hello", {"k": 1}], dst=3, group=odd)
        else:
            first, second, third = np.zeros(1), np.zeros(1), np.zeros(1)
            out["recv src=1 returns"] = dist.recv(first, src=1, group=odd)
            out["recv any returns"] = dist.recv(second, group=odd)
            dist.irecv(third, src=1, group=odd, tag=4).wait()
            out["p2p values"] = [first[0], second[0], third[0]]
            objects = [None, None]
            out["recv_object_list returns"] = dist.recv_object_list(objects, src=1, group=odd)
            out["recv_object_list"] = objects
        out["refused: send to a non-member"] = _refusal(
            lambda: dist.send(np.zeros(1), dst=2, group=odd))
        # A ring of two by P2POp: peer is a global rank, group_peer the group's.
        other = 4 - rank  # 1 <-> 3
        box, box2 = np.zeros(1), np.zeros(1)
        requests = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, np.array([float(rank)]), other, odd),
            dist.P2POp(dist.irecv, box, other, odd)])
        for request in requests:
            request.wait()
        requests = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, np.array([float(rank)]), group=odd, tag=1,
                       group_peer=odd.group_rank(other)),
            dist.P2POp(dist.irecv, box2, group=odd, tag=1,
                       group_peer=odd.group_rank(other))])
        for request in requests:
            request.wait()
        out["P2POp peer"] = (box[0], box2[0])
    out["rank, size in odd"] = (dist.get_rank(odd), dist.get_world_size(odd))

    # On the world, send_object_list / recv_object_list from any source.
    if rank == 0:
        dist.send_object_list([rank, "zero"], dst=2)
    elif rank == 2:
        objects = [None, None]
        out["world recv_object_list returns"] = dist.recv_object_list(objects)
        out["world recv_object_list"] = objects
        out["refused: wrong length"] = "no error"
    dist.barrier()
    if rank == 0:
        dist.send_object_list([1, 2, 3], dst=1)
    elif rank == 1:
        out["refused: wrong length"] = _refusal(lambda: dist.recv_object_list([None], src=0))
    out["refused: send without dst"] = _refusal(lambda: dist.send(np.zeros(1)))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_a_ported_torch_script_computes_what_torch_computes(transport):
    results = minidist.launch(_ported_script, world_size=4, transport=transport)
    r0, r1, r2, r3 = results
    for r in (r1, r2):
        assert r["broadcast src=1"] == [10.0] * 3, "src= is a global rank"
        assert r["broadcast group_src=1"] == [20.0] * 3
        assert "global rank 0 is not in the group, whose members are global ranks [1, 2]" \
            in r["refused: src not in group"]
        assert "group_src=" in r["refused: src not in group"]
        assert "not both" in r["refused: both"]
        assert "group_src=2 is out of range; the group has ranks 0..1" \
            in r["refused: group_src out of range"]
    assert r0["rank, size in pair"] == (-1, -1) and r3["rank, size in pair"] == (-1, -1)
    assert r1["rank, size in pair"] == (0, 2) and r2["rank, size in pair"] == (1, 2)

    assert r2["reduce dst=2"] == [6.0, 6.0]
    assert r3["reduce group_dst=2"] == [6.0, 6.0]
    assert r1["reduce dst=2"] == [1.0, 1.0], "a non-root keeps its input"
    assert r3["gather dst=3"] == [1.0, 2.0, 3.0], "gather_list in group-rank order"
    assert [r["scatter src=2"] for r in (r1, r2, r3)] == [100.0, 101.0, 102.0]

    for r in (r0, r2):
        assert r["broadcast_object_list src=2"] == ["from 2", 2]
    assert r2["gather_object dst=2"] == [{"r": 0}, {"r": 2}]
    assert (r0["scatter_object_list src=2"], r2["scatter_object_list src=2"]) == ("a", "b")

    assert r3["recv src=1 returns"] == 1 and r3["recv any returns"] == 1, \
        "recv returns the sender's global rank"
    assert r3["p2p values"] == [11.0, 12.0, 13.0]
    assert r3["recv_object_list returns"] == 1
    assert r3["recv_object_list"] == ["hello", {"k": 1}]
    for r in (r1, r3):
        assert "members are global ranks [1, 3]" in r["refused: send to a non-member"]
    assert r1["P2POp peer"] == (3.0, 3.0) and r3["P2POp peer"] == (1.0, 1.0)
    assert r1["rank, size in odd"] == (0, 2) and r3["rank, size in odd"] == (1, 2)
    assert r0["rank, size in odd"] == (-1, -1) and r2["rank, size in odd"] == (-1, -1)

    assert r2["world recv_object_list returns"] == 0
    assert r2["world recv_object_list"] == [0, "zero"]
    assert "got 3 objects into a list of 1" in r1["refused: wrong length"]
    assert "needs dst=" in r0["refused: send without dst"]


def test_p2pop_needs_exactly_one_peer():
    with pytest.raises(ValueError, match="exactly one of peer="):
        dist.P2POp(dist.isend, np.zeros(1))
    with pytest.raises(ValueError, match="exactly one of peer="):
        dist.P2POp(dist.isend, np.zeros(1), 1, group_peer=0)
