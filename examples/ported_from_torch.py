"""A torch DistributedDataParallel script, ported to minidist line by line.

    minidist run -n 2 examples/ported_from_torch.py      (torch: torchrun --nproc-per-node 2 ...)

Every line marked ``# torch:`` shows what it was; every other line is the
same in both. docs/coming_from_torch.md walks through each change and why.
"""

import numpy as np

import minidist.distributed as dist  # torch: import torch.distributed as dist
from minidist import Tensor, nn, optim  # torch: import torch; from torch import nn, optim
from minidist.data import DataLoader, DistributedSampler, load_digits
from minidist.parallel import DistributedDataParallel as DDP

# torch: from torch.utils.data import DataLoader, TensorDataset
# torch: from torch.utils.data.distributed import DistributedSampler
# torch: from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group(backend="gloo")  # "gloo": whatever transport minidist run chose
    rank = dist.get_rank()

    x_train, y_train, x_test, y_test = load_digits()
    dataset = (x_train, y_train)  # torch: TensorDataset(torch.tensor(x), torch.tensor(y))
    sampler = DistributedSampler(dataset)  # rank and world size from the process group
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    nn.init.manual_seed(0)  # torch: torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
                bucket_cap_mb=25)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(10):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(Tensor(x)), y)  # torch: model(x), y
            loss.backward()
            optimizer.step()
        dist.print0(f"epoch {epoch}: loss {loss.item():.3f}")

    # Every replica holds the same weights: gather rank 1's to rank 0 and compare.
    mine = np.concatenate([p.data.ravel() for p in model.parameters()])
    everyone = [np.empty_like(mine) for _ in range(dist.get_world_size())] if rank == 0 else None
    dist.gather(mine, everyone, dst=0)  # torch: dst=0 is a global rank there too
    if rank == 0:
        same = all(np.array_equal(everyone[0], other) for other in everyone[1:])
        with_grad_off = model.module(Tensor(x_test)).data.argmax(1)
        print(f"test accuracy {np.mean(with_grad_off == y_test):.3f}; "
              f"replicas identical: {same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
