"""Expert parallelism (minidist/parallel/expert/dispatch.py) must compute what
the whole mixture of experts computes on one process, train the MoE GPT to
the same weights over a dp x ep mesh, and send the bytes of the formula
given the routing (minidist/parallel/expert/costs.py).

One traced launch per world size (2 and 4 ranks, shm, float64) runs every
case inside the workers:

* one MoE layer (E = 4 experts, k = 1 and k = 2 with dropped choices, each
  rank a different number of tokens): each rank's output, input gradient
  and router gradient against the whole MoE on that rank's tokens alone
  (capacity per rank, so the reference is one call per rank's tokens); each
  rank's experts' gradients against the sum over ranks of the whole MoE's;
* each pass in a trace region: the bytes of each rank's sends against
  :func:`dispatch_bytes` of the dispatch matrix the routings give;
* three AdamW steps of the MoE GPT (aux loss included) on meshes dp x ep of
  1 x 2 (2 ranks), 2 x 2 and 1 x 4 (4 ranks): every rank's weights against
  one process that trains on all ranks' batches (each rank's batch a
  capacity group, the loss their mean).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import optim, trace
from minidist.distributed import init_device_mesh
from minidist.models.gpt import GPT
from minidist.models.moe import MoE, MoEGPT, MoEGPTConfig
from minidist.parallel.expert.costs import (
    COUNT_BYTES,
    balanced_dispatch_bytes,
    dense_mlp_all_reduce_bytes,
    dispatch_bytes,
    dispatch_matrix,
)
from minidist.parallel.expert.dispatch import (
    ExpertParallelMoE,
    allreduce_moe_grads,
    expert_parallel_gpt,
    expert_range,
)
from minidist.tensor import Tensor

CONFIG = MoEGPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, n_expert=4,
                      top_k=2, capacity_factor=1.0, aux_loss_coef=0.01)
LAYER_CASES = [(1, 1.0), (2, 0.75)]   # (top_k, capacity_factor)
MESHES = {2: [(1, 2)], 4: [(2, 2), (1, 4)]}   # (dp, ep)
BATCH, STEPS, TRAIN_STEPS = 2, 8, 3
RTOL, ATOL = 1e-9, 1e-12


def _whole_moe(k, factor):
    return MoE(CONFIG, CONFIG.n_expert, k, factor, rng=3, dtype=np.float64)


def _tokens(rank):
    """Rank r has 2 x (5 + r) tokens: the groups differ in size."""
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(2, 5 + rank, CONFIG.n_embd)), rng.normal(size=(2, 5 + rank, CONFIG.n_embd))


def _layer_case(k, factor):
    rank = dist.get_rank()
    shard = ExpertParallelMoE(_whole_moe(k, factor))
    tokens, weights = _tokens(rank)
    x = Tensor(tokens, requires_grad=True)
    with trace.region(f"k{k} forward"):
        y = shard(x)
        objective = (y * Tensor(weights)).sum() + shard.aux_loss * 0.3
    with trace.region(f"k{k} backward"):
        objective.backward()
    return dict(y=y.data, x_grad=x.grad, router=shard.router.weight.grad,
                experts={name: p.grad for name, p in shard.experts.named_parameters()},
                start=shard.expert_start, routing=shard.routing, sent=shard.dispatch.sent,
                received=shard.dispatch.received)


def _gpt():
    return MoEGPT(CONFIG, rng=0).to(np.float64)


def _batch(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)),
            rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)))


def _train(mesh_shape):
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "ep"))
    model = expert_parallel_gpt(_gpt(), mesh["ep"])
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(TRAIN_STEPS):
        idx, targets = _batch(step, dist.get_rank())
        optimizer.zero_grad()
        model.loss(model(idx), targets).backward()
        allreduce_moe_grads(model, mesh["dp"])
        optimizer.step()
    return dict(weights={name: p.data.copy() for name, p in model.named_parameters()},
                start=model.transformer.h[0].mlp.expert_start)


def _worker():
    world = dist.get_world_size()
    return dict(layer={case: _layer_case(*case) for case in LAYER_CASES},
                trained={shape: _train(shape) for shape in MESHES[world]})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("expert_parallel")
    outcome = {}
    for world in MESHES:
        path = folder / f"ep{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, transport="shm", trace=str(path),
                                  timeout=180)
        outcome[world] = (results, trace.read_jsonl(path).events)
    return outcome


# --------------------------------------------------------------------------
# One process: the whole MoE on each rank's tokens


def _reference_layer(k, factor, world):
    per_rank, expert_grads = [], None
    for rank in range(world):
        whole = _whole_moe(k, factor)
        tokens, weights = _tokens(rank)
        x = Tensor(tokens, requires_grad=True)
        y = whole(x)
        ((y * Tensor(weights)).sum() + whole.aux_loss * 0.3).backward()
        per_rank.append(dict(y=y.data, x_grad=x.grad, router=whole.router.weight.grad))
        grads = {name: p.grad for name, p in whole.experts.named_parameters()}
        expert_grads = grads if expert_grads is None else {
            name: expert_grads[name] + grads[name] for name in grads}
    return per_rank, expert_grads


def _global_name(local_name, start):
    index, rest = local_name.split(".", 1)
    return f"{start + int(index)}.{rest}"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", sorted(MESHES))
@pytest.mark.parametrize("case", LAYER_CASES, ids=["k1", "k2"])
def test_expert_parallel_layer_equals_the_whole_moe(runs, world, case):
    results, _ = runs[world]
    reference, expert_grads = _reference_layer(*case, world)
    if case[0] == 2:
        assert sum(r["layer"][case]["routing"].dropped for r in results) > 0
    for rank, result in enumerate(results):
        got = result["layer"][case]
        for key in ("y", "x_grad", "router"):
            np.testing.assert_allclose(got[key], reference[rank][key], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{key} on rank {rank}")
        assert got["start"] == expert_range(CONFIG.n_expert, rank, world)[0]
        assert len(got["experts"]) == len(expert_grads) // world
        for name, grad in got["experts"].items():
            np.testing.assert_allclose(grad, expert_grads[_global_name(name, got["start"])],
                                       rtol=RTOL, atol=ATOL, err_msg=f"{name} on rank {rank}")


def _regions(events, rank):
    return {e["label"]: (e["start"], e["end"]) for e in events
            if e["rank"] == rank and e["kind"] == "compute"}


def _sent_inside(events, rank, region):
    start, end = region
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", sorted(MESHES))
@pytest.mark.parametrize("case", LAYER_CASES, ids=["k1", "k2"])
def test_dispatch_bytes_in_the_trace_equal_the_formula(runs, world, case):
    results, events = runs[world]
    layers = [r["layer"][case] for r in results]
    matrix = dispatch_matrix([layer["routing"] for layer in layers], world)
    # The matrix is what each rank sent and received, its own rows included.
    np.testing.assert_array_equal(matrix, np.array([layer["sent"] for layer in layers]))
    np.testing.assert_array_equal(matrix.T, np.array([layer["received"] for layer in layers]))
    formula = dispatch_bytes(matrix, CONFIG.n_expert, CONFIG.n_embd, itemsize=8)
    for rank in range(world):
        regions = _regions(events, rank)
        forward = _sent_inside(events, rank, regions[f"k{case[0]} forward"])
        backward = _sent_inside(events, rank, regions[f"k{case[0]} backward"])
        print(f"k={case[0]} rank {rank}: rows to each rank {matrix[rank].tolist()}, forward "
              f"{forward} B (formula {formula.forward[rank]}), backward {backward} B (formula "
              f"{formula.backward[rank]})")   # pytest -s shows it
        assert (forward, backward) == (formula.forward[rank], formula.backward[rank])


# --------------------------------------------------------------------------
# Training over dp x ep against one process


def _whole_trained(world):
    model = _gpt()
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(TRAIN_STEPS):
        optimizer.zero_grad()
        total = None
        for rank in range(world):   # each rank's batch one capacity group, as on the ranks
            idx, targets = _batch(step, rank)
            loss = model.loss(model(idx), targets)
            total = loss if total is None else total + loss
        (total * (1.0 / world)).backward()
        optimizer.step()
    return {name: p.data for name, p in model.named_parameters()}


def _whole_name(name, start):
    if ".mlp.experts." not in name:
        return name
    head, rest = name.split(".mlp.experts.")
    return f"{head}.mlp.experts.{_global_name(rest, start)}"


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("world", "mesh"), [(w, m) for w in sorted(MESHES) for m in MESHES[w]],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_training_over_dp_x_ep_gives_the_weights_of_one_process(runs, world, mesh):
    results, _ = runs[world]
    whole = _whole_trained(world)
    dp, ep = mesh
    for rank, result in enumerate(results):
        trained = result["trained"][mesh]
        assert trained["start"] == (rank % ep) * CONFIG.n_expert // ep
        names = {_whole_name(name, trained["start"]) for name in trained["weights"]}
        experts_held = sum(".mlp.experts." in name for name in names)
        assert experts_held == sum(".mlp.experts." in name for name in whole) // ep
        for name, value in trained["weights"].items():
            np.testing.assert_allclose(value, whole[_whole_name(name, trained["start"])],
                                       rtol=RTOL, atol=ATOL, err_msg=f"{name} on rank {rank}")


# --------------------------------------------------------------------------
# The formulas, without processes


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("k", [1, 2])
def test_even_routing_sends_2_n_minus_1_over_n_k_N_C_s_and_k1_equals_the_dense_all_reduce(world, k):
    tokens, width, experts = 64, 16, 8
    per_pair = k * tokens // world
    matrix = np.full((world, world), per_pair)
    formula = dispatch_bytes(matrix, experts, width, itemsize=4)
    even = balanced_dispatch_bytes(tokens, k, width, world, itemsize=4)
    for rank in range(world):
        assert formula.dispatch[rank] + formula.combine[rank] == even
        assert formula.backward[rank] == even
        assert formula.counts[rank] == (world - 1) * (experts // world) * COUNT_BYTES
    dense = dense_mlp_all_reduce_bytes(tokens, width, world, itemsize=4)
    assert all(value * k == even for value in dense)


def test_an_overloaded_rank_sends_and_receives_more():
    matrix = np.array([[2, 6], [1, 3]])   # rank 1's experts take most rows
    formula = dispatch_bytes(matrix, 2, 4, itemsize=8)
    assert formula.dispatch == (6 * 32, 1 * 32)
    assert formula.combine == (1 * 32, 6 * 32)
    assert formula.backward == (7 * 32, 7 * 32)


def test_experts_that_do_not_split_over_the_ranks_say_what_to_use():
    with pytest.raises(ValueError, match=r"n_expert=4 .* 3 ranks.*\(1, 2, 4\)"):
        expert_range(4, 0, 3)
    with pytest.raises(TypeError, match="needs a MoEGPT"):
        expert_parallel_gpt(GPT(CONFIG, rng=0))
