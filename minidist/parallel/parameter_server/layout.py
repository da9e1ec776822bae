"""The parameter server's roles and key layout: who serves, who works, which keys where.

Roles. The ranks of the group are split by :class:`Layout`: ranks
``0 .. S-1`` are the servers, ranks ``S .. S+W-1`` the workers (worker ``k``
is rank ``S + k``). Every rank runs the same program; the strategy
(:mod:`.server`) sends each one down its role.

Sharding. The parameters are one flat vector of P numbers (a model's
parameters one after the other: :func:`flat_parameters`, and back with
:func:`load_flat_parameters`). Server ``s`` owns the contiguous key range
``shard_ranges(P, S)[s]``: the ranges are as even as possible, the first
``P % S`` of them one key longer. A worker pulls every range from its server
and pushes each server only its slice of the gradient; a server keeps its
slice of the weights, its slice of the optimizer state, and its own version
number, and never sees the rest.

Cost: with S servers each holds P / S of the weights and receives, per
step, W P / S of the gradients, W the workers: sharding divides a lone
server's load by S. Read first, before :mod:`.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import nn


def shard_ranges(size: int, shards: int) -> list[tuple[int, int]]:
    """Split keys ``0 .. size-1`` into ``shards`` contiguous ranges ``(start, stop)``,
    as even as possible: the first ``size % shards`` ranges are one key longer."""
    if shards < 1:
        raise ValueError(f"need at least one shard, got {shards}")
    lengths = [size // shards + (1 if index < size % shards else 0) for index in range(shards)]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    return [(int(start), int(stop)) for start, stop in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class Layout:
    """Who does what: ranks ``0 .. servers-1`` are servers, the rest workers.

    Ranks are group ranks (world ranks when there is no group)."""

    servers: int
    workers: int

    @classmethod
    def for_world(cls, world_size: int, servers: int, rank: int = 0) -> Layout:
        if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
            raise ValueError(f"rank {rank}: servers must be a whole number >= 1, got {servers!r}")
        if servers >= world_size:
            raise ValueError(
                f"rank {rank}: {servers} server(s) in a world of {world_size} rank(s) leaves no "
                f"worker; launch at least {servers + 1} ranks, or use servers <= "
                f"{max(world_size - 1, 1)}")
        return cls(int(servers), int(world_size - servers))

    @property
    def size(self) -> int:
        return self.servers + self.workers

    def is_server(self, rank: int) -> bool:
        return rank < self.servers

    def role(self, rank: int) -> str:
        return "server" if self.is_server(rank) else "worker"

    def server_rank(self, server: int) -> int:
        return server

    def worker_rank(self, worker: int) -> int:
        return self.servers + worker

    def worker_of(self, rank: int) -> int:
        return rank - self.servers


def flat_parameters(model: nn.Module) -> np.ndarray:
    """The model's trainable parameters, one after the other, as one new flat array."""
    return np.concatenate([p.data.reshape(-1) for p in model.parameters() if p.requires_grad])


def load_flat_parameters(model: nn.Module, weights: np.ndarray) -> None:
    """Copy consecutive pieces of ``weights`` into the model's parameters, in place."""
    offset = 0
    for param in (p for p in model.parameters() if p.requires_grad):
        param.data[...] = weights[offset:offset + param.data.size].reshape(param.data.shape)
        offset += param.data.size

