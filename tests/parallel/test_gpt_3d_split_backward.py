"""The GPT on a DP x TP x PP mesh with the backward split in two (I and W)
and on the V placement must end with the weights of one process, as with
1F1B (tests/parallel/test_gpt_3d.py holds those).

One launch per world size (2, 4), each case from its own
``init_device_mesh``, two AdamW steps in float64 on fixed global batches:

* 2 ranks, pp2: 1F1B with every B split into I and W (W one compute action
  later); interleaved 1F1B split the same way; the V placement (GPipe's
  order on it, every W at the end): pipeline rank 0 holds the embeddings
  and the head, so the tied ``wte`` / ``lm_head`` is one Parameter there and
  the embedding group is not made;
* 4 ranks: pp2 x tp2 on the V placement (the tensor-parallel all_reduces
  of the blocks run inside I, the same on both tp ranks); pp2 x tp2 with
  sequence parallelism, 1F1B split with every W at the end; pp2 x dp2 on
  the V placement;
* the zero-bubble schedules of ``make_schedule`` that exist, by name.

The hand-made orders are those of tests/parallel/test_pipeline_split_backward.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
from minidist import optim
from minidist.distributed import init_device_mesh
from minidist.parallel.mesh.gpt_3d import GPT3D
from minidist.parallel.pipeline import SCHEDULES, interleaved_one_f_one_b, one_f_one_b
from minidist.parallel.tensor.gpt import shard_index
from tests.parallel.test_gpt_3d import (
    ATOL,
    CONFIG,
    RTOL,
    TRAIN_STEPS,
    _batch,
    _model,
    whole,  # noqa: F401  (the fixture: one process's weights)
)
from tests.parallel.test_pipeline_split_backward import _loop_split, _v_order

MICROBATCHES = 2  # a batch of 4, 2 a replica with dp2


def _schedule(order, pp):
    if order == "1f1b next":
        return _loop_split(one_f_one_b, pp, MICROBATCHES, "next")
    if order == "1f1b end":
        return _loop_split(one_f_one_b, pp, MICROBATCHES, "end")
    if order == "interleaved next":
        return _loop_split(interleaved_one_f_one_b, pp, MICROBATCHES, "next")
    if order == "v end":
        return _v_order(pp, MICROBATCHES, "end")
    if order == "v next":
        return _v_order(pp, MICROBATCHES, "next")
    return order   # a zero-bubble schedule's name


#: (name, (pp, dp, tp), order, sequence_parallel)
CASES = {
    2: [("pp2 1f1b I/W", (2, 1, 1), "1f1b next", False),
        ("pp2 interleaved I/W", (2, 1, 1), "interleaved next", False),
        ("pp2 V", (2, 1, 1), "v end", False),
        *[(f"pp2 {name}", (2, 1, 1), name, False)
          for name in ("zb_h1", "zb_h2", "zbv", "dualpipev") if name in SCHEDULES]],
    4: [("pp2 x tp2 V", (2, 1, 2), "v next", False),
        ("pp2 x tp2 +sp 1f1b I/W", (2, 1, 2), "1f1b end", True),
        ("pp2 x dp2 V", (2, 2, 1), "v end", False)],
}


def _train(shape, order, sequence_parallel):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
    # DualPipeV needs at least 2p micro-batches (DeepSeek's rule): one sequence each
    microbatches = 2 * shape[0] if order == "dualpipev" else MICROBATCHES
    gpt = GPT3D(_model(), mesh, _schedule(order, shape[0]), microbatches=microbatches,
                sequence_parallel=sequence_parallel)
    optimizer = optim.AdamW(gpt.parameters(), lr=1e-2, weight_decay=0.1)
    losses = [gpt.step(*_batch(step), optimizer) for step in range(TRAIN_STEPS)]
    return dict(params={name: p.data.copy() for name, p in gpt.named_parameters().items()},
                tp_rank=mesh.get_local_rank("tp"), losses=losses,
                embedding_group=gpt.embedding_group is not None)


def _worker(world):
    return {name: _train(shape, order, sp) for name, shape, order, sp in CASES[world]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4])
def test_split_backward_and_v_placement_train_to_the_weights_of_one_process(world, whole):  # noqa: F811
    weights, losses = whole
    results = minidist.launch(_worker, world_size=world, transport="shm", args=(world,),
                              timeout=300)
    for name, (pp, _, tp), order, _ in CASES[world]:
        wrong, seen = [], set()
        for rank, result in enumerate(results):
            run = result[name]
            for param, shard in run["params"].items():
                seen.add(param)
                full = weights[param]
                expected = full[shard_index(param, full.shape, run["tp_rank"], tp, CONFIG)]
                if not np.allclose(shard, expected, rtol=RTOL, atol=ATOL):
                    wrong.append((param, rank))
        assert not wrong, f"{name}: shards differ from one process's weights: {wrong}"
        v_placement = order.startswith("v") or order in ("zbv", "dualpipev")
        if v_placement:   # rank 0 holds both ends: one Parameter, named once
            seen.add("lm_head.weight")
            assert not any(r[name]["embedding_group"] for r in results), name
        assert seen == set(weights), f"{name}: held by no rank: {set(weights) - seen}"
        first = [r[name]["losses"][0] for r in results if r[name]["losses"][0] is not None]
        assert len(first) == world // pp, name
        assert np.mean(first) == pytest.approx(losses[0], rel=1e-9), name
