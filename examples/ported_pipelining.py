"""A torch.distributed.pipelining training script, ported to minidist line by line.

    minidist run -n 2 examples/ported_pipelining.py 1f1b interleaved_1f1b
    (torch: torchrun --nproc-per-node 2 train.py 1f1b interleaved_1f1b)

Every line marked ``# torch:`` shows the torch line it replaces; every other
line is the same in both (tests/parallel/test_pipelining_torch_names.py
turns this file back into the torch script, runs both and compares). A
Sequential of four Linear layers is cut by hand into one stage a rank
(GPipe, 1F1B, the interleaved zero bubble) or two (interleaved 1F1B: stage
c p + r on rank r; ZB-V and DualPipeV: stages r and 2p - 1 - r), and trained two SGD steps on 13
examples in 4 micro-batches. Its weights come from one NumPy seed, so both
scripts start equal. With ``--record FOLDER`` every rank writes there, for
each schedule, each micro-batch's loss, the merged output and its
parameters' gradients of each step, and its weights at the end.
"""

import argparse
from pathlib import Path

import numpy as np

import minidist.distributed as dist  # torch: import torch.distributed as dist
from minidist import nn, optim  # torch: import torch; from torch import nn, optim
from minidist.parallel.pipeline.pipelining import (  # torch: from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

#: name -> (schedule class, stages per rank)
SCHEDULES = {"gpipe": (ScheduleGPipe, 1), "1f1b": (Schedule1F1B, 1),
             "interleaved_1f1b": (ScheduleInterleaved1F1B, 2),
             "interleaved_zero_bubble": (ScheduleInterleavedZeroBubble, 1),
             "zbv": (ScheduleZBVZeroBubble, 2), "dualpipev": (ScheduleDualPipeV, 2)}
V_SHAPED = (ScheduleZBVZeroBubble, ScheduleDualPipeV)
ONE_STAGE = (ScheduleGPipe, Schedule1F1B)   # the others take a list of the rank's stages
MICROBATCHES = 4


def stage_indices(schedule_class, per_rank, rank, world):
    if schedule_class in V_SHAPED:
        return [rank, 2 * world - 1 - rank]
    return [rank + chunk * world for chunk in range(per_rank)]


def train(name, rank, world, record):
    schedule_class, per_rank = SCHEDULES[name]
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    state = {key: rng.normal(size=tuple(p.shape)) * 0.5 for key, p in model.named_parameters()}
    model.load_state_dict(state)  # torch: model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    x = rng.normal(size=(13, 6))  # torch: x = torch.tensor(rng.normal(size=(13, 6)))
    y = rng.integers(0, 3, 13)  # torch: y = torch.tensor(rng.integers(0, 3, 13))

    num_stages = world * per_rank
    cuts = np.linspace(0, 4, num_stages + 1).astype(int) * 2   # the Linear layers evenly
    cuts[-1] = len(model)
    device = "cpu"  # torch: device = torch.device("cpu")
    stages = [PipelineStage(model[cuts[i]:cuts[i + 1]], i, num_stages, device)
              for i in stage_indices(schedule_class, per_rank, rank, world)]
    schedule = schedule_class(stages[0] if schedule_class in ONE_STAGE else stages, MICROBATCHES,
                              loss_fn=nn.CrossEntropyLoss())
    parameters = [p for stage in stages for p in stage.submod.parameters()]
    names = {id(p): key for key, p in model.named_parameters()}
    optimizer = optim.SGD(parameters, lr=0.1, momentum=0.9)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    for step in range(2):
        optimizer.zero_grad()
        losses = []
        output = schedule.step(*((x,) if first else ()), target=y if last else None,
                               losses=losses)
        if last:
            record[f"{step}.losses"] = np.array([loss.item() for loss in losses])
            record[f"{step}.output"] = output.detach().numpy()
            print(f"{name} step {step}: losses " + " ".join(f"{loss.item():.6f}" for loss in losses))
        for p in parameters:
            record[f"{step}.grad.{names[id(p)]}"] = np.array(p.grad)
        optimizer.step()
    for p in parameters:
        record[f"weight.{names[id(p)]}"] = np.array(p.data)


def main():
    parser = argparse.ArgumentParser()
    # Checked below, not by choices=: argparse checks an empty list against them.
    parser.add_argument("schedules", nargs="*", help=f"of {sorted(SCHEDULES)}; default: 1f1b")
    parser.add_argument("--record", help="a folder for each rank's .npz of each schedule")
    arguments = parser.parse_args()
    unknown = sorted(set(arguments.schedules) - set(SCHEDULES))
    if unknown:
        parser.error(f"unknown schedules {unknown}; choose from {sorted(SCHEDULES)}")
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in arguments.schedules or ["1f1b"]:
        record = {}
        train(name, rank, world, record)
        if arguments.record:
            np.savez(Path(arguments.record) / f"{name}.{rank}.npz", **record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
