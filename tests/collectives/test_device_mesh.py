"""The device mesh: torch's layout of ranks, a group per slice along each
dimension, sub-meshes by name, a 1-D mesh as a strategy's group, clear errors.

The reference layout is torch's. With torch installed, torch 2.13's own
``init_device_mesh`` runs in this process on its "fake" backend (a world of
any size in one process), once per rank, and reports its mesh, its groups and
its sub-meshes; without it, torch's rule as its code states it (ranks
``arange(world).view(shape)``; the group of a rank along dimension d: the
ranks that share its other coordinates), written apart from minidist's, and
the groups torch 2.13 printed for a 2 x 2 x 2 mesh, recorded.

Real processes: one launch of 4 ranks (a 2 x 2 mesh, DDP over "dp", the
errors) and one of 8 (2 x 2 x 2: every dimension's groups and sums).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn
from minidist.distributed.device_mesh import (
    DeviceMesh,
    as_group,
    groups_along,
    init_device_mesh,
    mesh_layout,
)
from minidist.parallel import DistributedDataParallel
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

SHAPES = [(4,), (1, 4), (2, 3), (3, 2), (2, 2, 2), (2, 3, 2), (3, 1, 2)]


def _rule_group(shape, rank, dim) -> list[int]:
    """torch's rule, from coordinates: the ranks equal to ``rank`` in every
    coordinate but ``dim``, row-major."""
    world = int(np.prod(shape))
    mine = np.unravel_index(rank, shape)
    return [r for r in range(world)
            if all(c == m for d, (c, m) in enumerate(zip(np.unravel_index(r, shape), mine))
                   if d != dim)]


def _torch_facts(shape, names):
    """What torch 2.13 says, per rank: its mesh, its group along each
    dimension, its coordinate, and each sub-mesh of two or more names in order."""
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world, facts = int(np.prod(shape)), {}
    for rank in range(world):
        tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            mesh = torch_mesh("cpu", shape, mesh_dim_names=names)
            subs = {}
            for count in range(1, len(names) + 1):
                for chosen in itertools.combinations(names, count):
                    sub = mesh[chosen]
                    subs[chosen] = (sub.mesh.tolist(), sub.get_coordinate())
            facts[rank] = {
                "mesh": mesh.mesh.tolist(), "coordinate": mesh.get_coordinate(),
                "groups": [tdist.get_process_group_ranks(mesh.get_group(d))
                           for d in range(len(shape))],
                "local": [mesh.get_local_rank(d) for d in range(len(shape))], "subs": subs}
        finally:
            tdist.destroy_process_group()
    del torch
    return facts


# --------------------------------------------------------------------------- layouts, no process


@pytest.mark.parametrize("shape", SHAPES)
def test_layout_and_groups_follow_torchs_rule(shape):
    mesh = mesh_layout(shape)
    world = int(np.prod(shape))
    assert mesh.shape == shape
    for rank in range(world):
        coordinate = tuple(int(i) for i in np.argwhere(mesh == rank)[0])
        assert coordinate == np.unravel_index(rank, shape)
        for dim in range(len(shape)):
            groups = [g for g in groups_along(mesh, dim) if rank in g]
            assert groups == [_rule_group(shape, rank, dim)]
    for dim in range(len(shape)):  # the groups of a dimension cut the world
        assert sorted(r for g in groups_along(mesh, dim) for r in g) == list(range(world))


def test_groups_recorded_from_torch_2_13():
    """What torch 2.13 printed (rank 0 and rank 5 of a 2 x 2 x 2 mesh; the
    order in which its init_device_mesh called new_group for 2 x 3 x 2)."""
    mesh = mesh_layout((2, 2, 2))
    assert mesh.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    mine = {0: [[0, 4], [0, 2], [0, 1]], 5: [[1, 5], [5, 7], [4, 5]]}
    for rank, groups in mine.items():
        assert [next(g for g in groups_along(mesh, d) if rank in g) for d in range(3)] == groups
    made = [g for d in range(3) for g in groups_along(mesh_layout((2, 3, 2)), d)]
    assert made == [[0, 6], [1, 7], [2, 8], [3, 9], [4, 10], [5, 11], [0, 2, 4], [1, 3, 5],
                    [6, 8, 10], [7, 9, 11], [0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


@pytest.mark.parametrize("shape", [(4,), (2, 3), (2, 2, 2)])
def test_layout_against_live_torch(shape):
    """torch's own init_device_mesh, on its fake backend, rank by rank."""
    names = ("dp", "tp", "pp")[:len(shape)]
    facts = _torch_facts(shape, names)
    mesh = mesh_layout(shape)
    for rank, fact in facts.items():
        assert fact["mesh"] == mesh.tolist()
        coordinate = tuple(int(i) for i in np.argwhere(mesh == rank)[0])
        assert fact["coordinate"] == coordinate
        for dim in range(len(shape)):
            assert fact["groups"][dim] == next(g for g in groups_along(mesh, dim) if rank in g)
            assert fact["local"][dim] == coordinate[dim]
        for chosen, (sub, sub_coordinate) in fact["subs"].items():
            dims = [names.index(n) for n in chosen]
            index = tuple(slice(None) if d in dims else coordinate[d] for d in range(len(shape)))
            assert sub == mesh[index].tolist(), chosen
            assert sub_coordinate == tuple(coordinate[d] for d in dims)


# --------------------------------------------------------------------------- on real processes


def _error(call) -> str:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the message is what is checked
        return f"{type(error).__name__}: {error}"
    return "no error"


def _four_ranks():
    rank = dist.get_rank()
    out = {"errors": {}}
    errors = out["errors"]
    # Refused before any group is made, so every rank refuses alike.
    errors["size"] = _error(lambda: init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp")))
    errors["dup"] = _error(lambda: init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "a")))
    errors["names"] = _error(lambda: init_device_mesh("cpu", (2, 2), mesh_dim_names=("a",)))
    errors["index"] = _error(lambda: init_device_mesh("cuda:0", (2, 2)))
    errors["cuda"] = _error(lambda: init_device_mesh("cuda", (2, 2)))

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out.update(mesh=mesh.mesh.tolist(), coordinate=mesh.get_coordinate(), shape=mesh.shape,
               ndim=mesh.ndim, size=mesh.size(), sizes=(mesh.size(0), mesh.size("tp")),
               names=mesh.mesh_dim_names, device=mesh.device_type, repr=repr(mesh))
    out["groups"] = {name: list(mesh.get_group(name).ranks) for name in ("dp", "tp")}
    out["by_index"] = [list(g.ranks) for g in mesh.get_all_groups()]
    out["local"] = {name: mesh.get_local_rank(name) for name in ("dp", "tp")}
    tp = mesh["tp"]
    out["tp"] = (tp.mesh.tolist(), tp.mesh_dim_names, tp.get_coordinate(), tp.size(),
                 tp.get_local_rank(), tp.get_group() is mesh.get_group("tp"))
    out["same"] = mesh["dp", "tp"] is mesh
    sums = {}
    for name in ("dp", "tp"):
        x = np.array([rank + 1.0])
        dist.all_reduce(x, group=mesh.get_group(name))
        sums[name] = float(x[0])
        y = np.array([rank + 1.0])
        dist.all_reduce(y, group=mesh[name].get_group())
        assert y[0] == x[0]
    out["sums"] = sums
    errors["unknown"] = _error(lambda: mesh["xx"])
    errors["order"] = _error(lambda: mesh["tp", "dp"])
    errors["no_dim"] = _error(mesh.get_group)
    errors["local_no_dim"] = _error(mesh.get_local_rank)
    errors["bad_dim"] = _error(lambda: mesh.get_group("pp"))
    errors["collective"] = _error(lambda: dist.all_reduce(np.ones(1), group=mesh["tp"]))
    errors["strategy_2d"] = _error(lambda: as_group(mesh, "DistributedDataParallel"))
    errors["both"] = _error(lambda: as_group(mesh.get_group("dp"), "DDP", device_mesh=mesh["dp"]))
    unnamed = init_device_mesh("cpu", (4,))
    out["world"] = unnamed.get_group() is dist.world_group()
    errors["unnamed"] = _error(lambda: unnamed["dp"])

    # DDP over "dp", given as a 1-D mesh both ways: the gradients are the
    # mean over this rank's "dp" group, not over the world.
    def ddp_grad(**where):
        nn.init.manual_seed(1)
        model = nn.Linear(3, 2)
        ddp = DistributedDataParallel(model, **where)
        x = np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1)
        (ddp(Tensor(x)) ** 2).sum().backward()
        return model.weight.grad.copy()

    out["ddp_group"] = ddp_grad(process_group=mesh["dp"])
    out["ddp_mesh"] = ddp_grad(device_mesh=mesh["dp"])

    # Megatron's column then row split over "tp", the group given as mesh["tp"]:
    # the unsplit block's output on every rank.
    nn.init.manual_seed(2)
    first, second = nn.Linear(3, 4), nn.Linear(4, 2)
    block = nn.Sequential(ColumnParallelLinear.from_linear(first, group=mesh["tp"]), nn.ReLU(),
                          RowParallelLinear.from_linear(second, group=mesh["tp"]))
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    out["tp_block"] = (block(x).data, second(first(x).relu()).data)
    return out


def _alone_grad(rank):
    nn.init.manual_seed(1)
    model = nn.Linear(3, 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1)
    (model(Tensor(x)) ** 2).sum().backward()
    return model.weight.grad.copy()


def test_a_2x2_mesh_on_four_ranks():
    results = minidist.launch(_four_ranks, world_size=4, transport="shm")
    layout = mesh_layout((2, 2))
    for rank, out in enumerate(results):
        coordinate = tuple(int(i) for i in np.argwhere(layout == rank)[0])
        assert out["mesh"] == layout.tolist() and out["coordinate"] == coordinate
        assert (out["shape"], out["ndim"], out["size"], out["sizes"]) == ((2, 2), 2, 4, (2, 2))
        assert out["names"] == ("dp", "tp") and out["device"] == "cpu"
        assert "dp=2, tp=2" in out["repr"]
        for dim, name in enumerate(("dp", "tp")):
            members = _rule_group((2, 2), rank, dim)
            assert out["groups"][name] == members == out["by_index"][dim]
            assert out["local"][name] == coordinate[dim]
            assert out["sums"][name] == sum(r + 1 for r in members)
        assert out["tp"] == (_rule_group((2, 2), rank, 1), ("tp",), (coordinate[1],), 2,
                             coordinate[1], True)
        assert out["same"] and out["world"]
        dp = _rule_group((2, 2), rank, 0)
        expected = sum(_alone_grad(r) for r in dp) / len(dp)
        np.testing.assert_allclose(out["ddp_group"], expected, rtol=1e-6)
        np.testing.assert_allclose(out["ddp_mesh"], expected, rtol=1e-6)
        np.testing.assert_allclose(*out["tp_block"], rtol=1e-5, atol=1e-6)
    errors = results[0]["errors"]
    for out in results:  # alike on every rank, but the collective's (it shows the rank's mesh)
        assert {k: v for k, v in out["errors"].items() if k != "collective"} == \
            {k: v for k, v in errors.items() if k != "collective"}
    assert "2 x 3 = 6 ranks" in errors["size"] and "has 4" in errors["size"]
    assert "unique" in errors["dup"] and "'a'" in errors["dup"]
    assert "same length" in errors["names"]
    assert "with index" in errors["index"]
    assert "backend.use('cupy')" in errors["cuda"]
    assert errors["unknown"].startswith("KeyError") and "'xx'" in errors["unknown"]
    assert "ascending order" in errors["order"] and "['dp', 'tp']" in errors["order"]
    assert "get_group('dp')" in errors["no_dim"] and "get_all_groups" in errors["no_dim"]
    assert "get_local_rank('dp')" in errors["local_no_dim"]
    assert "'pp' does not exist" in errors["bad_dim"]
    assert errors["collective"].startswith("TypeError")
    assert "a mesh is not a group" in errors["collective"]
    assert "mesh.get_group('tp')" in errors["collective"]
    assert "mesh['dp']" in errors["strategy_2d"]
    assert "not both" in errors["both"]
    assert "without mesh_dim_names" in errors["unnamed"]


def _eight_ranks():
    rank = dist.get_rank()
    names = ("dp", "tp", "pp")
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
    out = {"groups": [list(mesh.get_group(d).ranks) for d in range(3)],
           "coordinate": mesh.get_coordinate(), "sums": [], "subs": {}}
    for dim in range(3):
        x = np.array([2.0 ** rank])  # the sum names its members
        dist.all_reduce(x, group=mesh.get_group(names[dim]))
        out["sums"].append(float(x[0]))
    for count in (1, 2):
        for chosen in itertools.combinations(names, count):
            sub = mesh[chosen]
            out["subs"][chosen] = (sub.mesh.tolist(), sub.get_coordinate(),
                                   [list(g.ranks) for g in sub.get_all_groups()])
    dp_pp = mesh["dp", "pp"]
    x = np.array([2.0 ** rank])
    dist.all_reduce(x, group=dp_pp.get_group("pp"))
    out["sub_sum"] = float(x[0])
    explicit = DeviceMesh("cpu", [[7, 6, 5, 4], [3, 2, 1, 0]], mesh_dim_names=("a", "b"))
    out["explicit"] = (list(explicit.get_group("a").ranks), explicit.get_local_rank("a"),
                       explicit.get_coordinate())
    return out


def test_a_2x2x2_mesh_on_eight_ranks():
    results = minidist.launch(_eight_ranks, world_size=8, transport="shm")
    shape, names = (2, 2, 2), ("dp", "tp", "pp")
    layout = mesh_layout(shape)
    for rank, out in enumerate(results):
        coordinate = tuple(int(i) for i in np.argwhere(layout == rank)[0])
        assert out["coordinate"] == coordinate
        for dim in range(3):
            members = _rule_group(shape, rank, dim)
            assert out["groups"][dim] == members
            assert out["sums"][dim] == sum(2.0 ** r for r in members)
        for chosen, (sub, sub_coordinate, groups) in out["subs"].items():
            dims = [names.index(n) for n in chosen]
            index = tuple(slice(None) if d in dims else coordinate[d] for d in range(3))
            assert sub == layout[index].tolist()
            assert sub_coordinate == tuple(coordinate[d] for d in dims)
            assert groups == [_rule_group(shape, rank, d) for d in dims]
        assert out["sub_sum"] == out["sums"][2]
        # An explicit mesh: groups of sorted ranks, torch's numbering by global rank.
        where = np.argwhere(np.array([[7, 6, 5, 4], [3, 2, 1, 0]]) == rank)[0]
        column = sorted([[7, 6, 5, 4], [3, 2, 1, 0]][i][where[1]] for i in range(2))
        assert out["explicit"] == (column, column.index(rank), tuple(int(i) for i in where))
