"""The same DTensor ops on PyTorch's DTensor, on gloo (a peer of
test_dtensor_ops.py, run by ``minidist.bench.common.spawn_torch_ranks``):
each case's result placements (in minidist's short notation), its local
shape and its local values."""

from __future__ import annotations

import numpy as np


def cases(np_module, make, F, R, S, mesh):
    """(name, result) for each case; ``make(array, placements)`` a DTensor."""
    rng = np_module.random.default_rng(3)
    A, B = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    W, row = rng.standard_normal((7, 3)), rng.standard_normal(7)
    X3, Wl, bl = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 7)), rng.standard_normal(7)
    return [
        ("S0+S0", make(A, [S(0)]) + make(B, [S(0)])),
        ("S1*R", make(A, [S(1)]) * make(B, [R()])),
        ("S1*Rrow", make(A, [S(1)]) * make(row, [R()])),
        ("S0@R", make(A, [S(0)]) @ make(W, [R()])),
        ("R@S1", make(A, [R()]) @ make(W, [S(1)])),
        ("S1@S0", make(A, [S(1)]) @ make(W, [S(0)])),
        ("sum S0 axis0", make(A, [S(0)]).sum(0)),
        ("sum S0 axis1", make(A, [S(0)]).sum(1)),
        ("T", make(A, [S(0)]).T),
        ("tanh", make(A, [S(1)]).tanh()),
        ("col", F.linear(make(X3, [R()]), make(Wl, [S(0)]), make(bl, [S(0)]))),
        ("softmax", make(A, [S(0)]).softmax(1)),
        ("row", F.linear(make(X3, [S(2)]), make(Wl, [S(1)]), make(bl, [R()]))),
        ("layer_norm", F.layer_norm(make(X3, [S(1)]), (7,), make(bl, [R()]), make(row, [R()]))),
        ("reshape", make(X3, [S(2)]).reshape(10, 7)),
        ("embedding S1", F.embedding(make(np_module.array([[0, 4, 6]]), [R()]), make(A.T.copy(), [S(1)]))),
    ]


def short(placements):
    out = []
    for p in placements:
        if p.is_shard() and type(p).__name__ == "Shard":
            out.append(f"S({p.dim})")
        elif p.is_replicate():
            out.append("R")
        else:
            out.append("P(sum)")
    return tuple(out)


def torch_rank(rank, world_size, rendezvous, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))

    def make(array, placements):
        return distribute_tensor(torch.tensor(array), mesh, placements)

    found = {}
    for name, y in cases(np, make, F, Replicate, Shard, mesh):
        local = y.to_local()
        found[name] = (short(y.placements), tuple(local.shape), local.numpy().copy())
    dist.destroy_process_group()
    results.put((rank, found))
