"""A torch FSDP2 training script (fully_shard, clip_grad_norm_,
torch.distributed.checkpoint), ported to minidist line by line.

    minidist run -n 2 examples/ported_fsdp2.py --folder /tmp/fsdp2_ckpt
    (torch: torchrun --nproc-per-node 2 train_fsdp2.py --folder /tmp/fsdp2_ckpt)

Every line marked ``# torch:`` shows the torch line it replaces; every other
line is the same in both. A small MLP in float64 is sharded by ``fully_shard``
(each Linear a unit, then the root) on a 1-D mesh of every rank; each rank
trains on its share of a batch of 8 with AdamW, the gradients clipped to a
total norm of 1 (the norm of the whole gradient, summed over the shards: the
same on every rank). After 3 steps model and optimizer are saved with
``dcp.save``; a fresh model loads them, its weights come back bit for bit,
and one more step on both gives the same norm. The printed numbers are the
same for any number of ranks that divides 8, and the same as torch's.
"""

import argparse
import os
import tempfile

import numpy as np

import minidist.distributed as dist  # torch: import torch.distributed as dist
import minidist.distributed.checkpoint as dcp  # torch: import torch.distributed.checkpoint as dcp
from minidist import Tensor, nn, optim  # torch: from torch import nn, optim, tensor as Tensor
from minidist.distributed.checkpoint.state_dict import (  # torch: from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_state_dict,
)
from minidist.distributed.tensor import (  # torch: from torch.distributed.tensor import (
    init_device_mesh,
)
from minidist.parallel import fully_shard  # torch: from torch.distributed.fsdp import fully_shard

BATCH, STEPS = 8, 3


def build(mesh, seed):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    state = {key: rng.normal(size=tuple(p.shape)) for key, p in model.named_parameters()}
    model.load_state_dict({key: Tensor(value) for key, value in state.items()})
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def step(model, optimizer, batch, mine):
    inputs, targets = batch
    loss = nn.functional.mse_loss(model(Tensor(inputs[mine])), Tensor(targets[mine]))
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()
    total = Tensor(np.array([loss.item()]))
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), norm.full_tensor().item()


def whole(model):
    return {key: value.full_tensor().numpy() for key, value in model.state_dict().items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "ported_fsdp2"))
    arguments = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)   # this rank's share
    rng = np.random.default_rng(7)
    batches = [(rng.normal(size=(BATCH, 8)), rng.normal(size=(BATCH, 4))) for _ in range(STEPS + 1)]

    model, optimizer = build(mesh, seed=0)
    for index in range(STEPS):
        loss, norm = step(model, optimizer, batches[index], mine)
        if rank == 0:
            print(f"step {index}: loss {loss:.12e} grad norm {norm:.12e}")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=arguments.folder)

    fresh, fresh_optimizer = build(mesh, seed=1)
    fresh_sd, fresh_optim_sd = get_state_dict(fresh, fresh_optimizer)
    dcp.load({"model": fresh_sd, "optim": fresh_optim_sd}, checkpoint_id=arguments.folder)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=fresh_sd, optim_state_dict=fresh_optim_sd)
    saved, loaded = whole(model), whole(fresh)
    same = sorted(saved) == sorted(loaded) and all(np.array_equal(saved[k], loaded[k]) for k in saved)

    _, norm = step(model, optimizer, batches[STEPS], mine)
    _, fresh_norm = step(fresh, fresh_optimizer, batches[STEPS], mine)
    if rank == 0:
        print(f"loaded bit for bit: {same}; step {STEPS}: grad norm {norm:.12e}, "
              f"loaded {fresh_norm:.12e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
