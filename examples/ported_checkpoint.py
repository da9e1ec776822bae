"""A torch.distributed.checkpoint script, ported to minidist line by line.

    minidist run -n 2 examples/ported_checkpoint.py --folder /tmp/ckpt
    (torch: torchrun --nproc-per-node 2 save_and_reshard.py --folder /tmp/ckpt)

Every line marked ``# torch:`` shows the torch line it replaces; every other
line is the same in both. A small MLP's weights are laid out on a 1-D mesh
of every rank as row shards (``Shard(0)``, FSDP2's layout), its biases
replicated, with an Adam; model and optimizer state are saved with ``dcp.save``,
each rank writing its own rows. A fresh model laid out in column shards
(``Shard(1)``, another layout) loads the checkpoint: every rank reads only
the saved rows its columns cross, and the whole weights and Adam's state
come back bit for bit.
"""

import argparse
import os
import tempfile

import numpy as np

import minidist.distributed as dist  # torch: import torch.distributed as dist
import minidist.distributed.checkpoint as dcp  # torch: import torch.distributed.checkpoint as dcp
from minidist import nn, optim  # torch: import torch; from torch import nn, optim
from minidist.distributed.checkpoint.state_dict import (  # torch: from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_state_dict,
)
from minidist.distributed.tensor import (  # torch: from torch.distributed.tensor import (
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)


def build(mesh, weight_layout, seed):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    state = {key: rng.normal(size=tuple(p.shape)) for key, p in model.named_parameters()}
    model.load_state_dict(state)  # torch: model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    for layer in (model[0], model[2]):
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [weight_layout]))
        layer.bias = nn.Parameter(distribute_tensor(layer.bias.detach(), mesh, [Replicate()]))
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer


def whole(model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    arrays = {key: value.full_tensor().numpy() for key, value in model_sd.items()}
    for name, state in optim_sd["state"].items():
        for key, value in state.items():
            if key != "step":
                arrays[f"{name}.{key}"] = value.full_tensor().numpy()
    return arrays


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "ported_checkpoint"))
    arguments = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    model, optimizer = build(mesh, Shard(0), seed=0)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    for state in optim_sd["state"].values():   # made-up moments, so that there is state to keep
        for key, value in state.items():           # (a replicated one the same on every rank)
            if key != "step":
                here = rank * value.placements[0].is_shard() + 0.5
                value.to_local().data[...] = here  # torch: value.to_local().fill_(here)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    saved = whole(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=arguments.folder)

    fresh, fresh_optimizer = build(mesh, Shard(1), seed=1)
    fresh_sd, fresh_optim_sd = get_state_dict(fresh, fresh_optimizer)
    dcp.load({"model": fresh_sd, "optim": fresh_optim_sd}, checkpoint_id=arguments.folder)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=fresh_sd, optim_state_dict=fresh_optim_sd)
    loaded = whole(fresh, fresh_optimizer)

    same = sorted(saved) == sorted(loaded) and all(np.array_equal(saved[k], loaded[k]) for k in saved)
    layouts = sorted({str(p.placements) for p in fresh.parameters()})
    if rank == 0:
        print(f"saved on {world} ranks in Shard(0), loaded in {layouts}: {len(saved)} arrays, "
              f"bit for bit: {same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
