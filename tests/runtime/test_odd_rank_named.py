"""Ranks that disagree: the odd rank is named first, the same one every run.

Each case gives rank 1 another argument than ranks 0, 2 and 3: a mesh's
shape, a mesh's names, a pipeline's schedule
sizes. Every rank judges the same values the same way, so every rank
raises the same error, naming rank 1, whichever notices first: the cases run
three times each inside one launch per transport (each rank catches the
error and returns what it said), and one run that fails is launched to see
the launcher name rank 1 too.
"""

from __future__ import annotations

import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime.errors import CollectiveMismatchError, WorkerError

TRANSPORTS = ["pipe", "shm"]
REPEATS = 3


def _mesh_shape():
    shape = (4, 1) if dist.get_rank() == 1 else (2, 2)
    dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))


def _mesh_names():
    names = ("tp", "dp") if dist.get_rank() == 1 else ("dp", "tp")
    dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=names)


def _schedule():
    from minidist.models.gpt import GPT, GPTConfig
    from minidist.parallel.mesh import GPT3D

    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    mesh = dist.init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("pp", "dp", "tp"))
    GPT3D(GPT(config), mesh, "gpipe" if dist.get_rank() == 1 else "1f1b", microbatches=2)


CASES = {
    "mesh shape": (_mesh_shape, "rank 1 called init_device_mesh with mesh_shape (4, 1), "
                   "mesh_dim_names ('dp', 'tp') where ranks 0, 2 and 3 call it with "
                   "mesh_shape (2, 2)"),
    "mesh names": (_mesh_names, "rank 1 called init_device_mesh with mesh_shape (2, 2), "
                   "mesh_dim_names ('tp', 'dp') where ranks 0, 2 and 3 call it with "
                   "mesh_shape (2, 2), mesh_dim_names ('dp', 'tp')"),
    "schedule": (_schedule, "rank 1 called GPT3D with schedule 'gpipe', 2 micro-batches, 1 "
                 "virtual stage where ranks 0, 2 and 3 call it with schedule '1f1b'"),
}


def _every_case():
    """(case, repeat) -> (odd ranks, first line) as this rank saw them."""
    said = {}
    for name, (case, _) in CASES.items():
        for repeat in range(REPEATS):
            try:
                case()
                said[name, repeat] = None
            except CollectiveMismatchError as error:
                said[name, repeat] = (error.odd, str(error).splitlines()[0])
    return said


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_rank_names_the_odd_rank_every_time(transport):
    results = minidist.launch(_every_case, world_size=4, transport=transport, timeout=120)
    for name, (_, expected) in CASES.items():
        for repeat in range(REPEATS):
            for rank, said in enumerate(results):
                assert said[name, repeat] is not None, (name, rank, "no error")
                odd, first = said[name, repeat]
                assert odd == (1,), (name, rank, first)
                assert first.startswith(expected), (name, rank, first)


def _rank_1_has_another_mesh():
    _mesh_names()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_launcher_names_the_odd_rank_whoever_noticed(transport):
    for _ in range(REPEATS):
        with pytest.raises(WorkerError) as caught:
            minidist.launch(_rank_1_has_another_mesh, world_size=4, transport=transport,
                            timeout=60)
        first = str(caught.value).splitlines()[0]
        assert caught.value.rank == 1 and caught.value.kind == "mismatch", first
        assert first.startswith(CASES["mesh names"][1]), first


def test_the_reference_is_the_majority_and_of_two_the_lower_rank():
    from minidist.distributed.agreement import disagreement, odd_ones

    assert odd_ones(["a", "b", "a", "a"]) == ("a", [0, 2, 3], [1])
    assert odd_ones(["b", "a", "a", "a"]) == ("a", [1, 2, 3], [0])
    assert odd_ones(["a", "b"]) == ("a", [0], [1])  # two ranks: the lower rank's is the reference
    assert odd_ones({4: "x", 7: "y", 9: "y"}) == ("y", [7, 9], [4])
    assert odd_ones(["a", "a"])[2] == []
    assert disagreement("f", ["a", "a"]) is None
    assert disagreement("f", [1, 2, 1]) == "rank 1 called f with 2 where ranks 0 and 2 call it with 1"
