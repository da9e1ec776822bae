"""torch's tensor-parallel styles on DTensors (minidist.parallel.placements)
against one process and against the by-hand split layers, float64:

* an MLP (ColwiseParallel then RowwiseParallel) and the GPT (torch's plan:
  vocab-parallel wte, PackedColwiseParallel(3) c_attn, Rowwise c_proj,
  Colwise c_fc, Rowwise c_proj, Colwise lm_head tied to wte; the loss by
  ``loss_parallel()``): the loss of each of 2 SGD steps equals the whole
  model's and the split layers' (rtol 1e-9), the first step's gradients and
  the final weights equal the whole model's (each rank's piece of them);
* the parameters are DTensorParameters with torch's layouts; uneven out
  features (Linear(10, 33): torch.chunk's 17 / 16 on 2 ranks, 9, 9, 9, 6 on
  4) give the whole layer's values, also through a Rowwise Linear(33, 5);
* SequenceParallel on a LayerNorm (activations Shard(1), weight Replicate,
  its gradient all_reduced), and a sequence-parallel MLP after it
  (ColwiseParallel(input_layouts=Shard(1)): an all_gather;
  RowwiseParallel(output_layouts=Shard(1)): a reduce_scatter);
  PrepareModuleInput and PrepareModuleOutput;
* the messages, from the trace: Colwise none forward and one all_reduce (dX)
  backward, Rowwise one all_reduce forward and none backward;
* a rank whose batch disagrees inside a Rowwise forward's all_reduce ends
  every rank, the error naming it.

One traced launch per world size (2 and 4) and transport (pipe and shm).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, optim, trace
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.runtime.errors import WorkerError

RTOL, ATOL = 1e-9, 1e-12
CONFIG = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=4, n_embd=16)
RUNS = [(2, "pipe"), (2, "shm"), (4, "pipe"), (4, "shm")]
STEPS, LR = 2, 0.1


def _mlp():
    from minidist import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 12, rng=1, dtype=np.float64)
            self.fc2 = nn.Linear(12, 8, rng=2, dtype=np.float64)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    return MLP()


def _mlp_data(step):
    rng = np.random.default_rng(20 + step)
    return rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 8))


def _train_mlp(model):
    losses, grads = [], None
    optimizer = optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, target = _mlp_data(step)
        optimizer.zero_grad()
        loss = F.mse_loss(model(Tensor(x)), target)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(float(loss.data))
    return dict(losses=losses, grads=grads,
                weights={n: p.data.copy() for n, p in model.named_parameters()})


def _batch(step):
    rng = np.random.default_rng(10 + step)
    return (rng.integers(0, CONFIG.vocab_size, (2, 8)),
            rng.integers(0, CONFIG.vocab_size, (2, 8)))


def _torch_plan(model, mesh):
    from minidist.parallel import (
        ColwiseParallel,
        PackedColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    plan = {"transformer.wte": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for part, style in (("attn.c_attn", PackedColwiseParallel(3)),
                        ("attn.c_proj", RowwiseParallel()),
                        ("mlp.c_fc", ColwiseParallel()), ("mlp.c_proj", RowwiseParallel())):
        plan[f"transformer.h.*.{part}"] = style
    parallelize_module(model, mesh, plan)
    for block in model.transformer.h:
        block.attn.n_head //= mesh.size()
    model.lm_head.weight = model.transformer.wte.weight
    return model


def _train_gpt(model, loss_of):
    losses, grads = [], None
    optimizer = optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        loss = loss_of(model(idx), targets)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(float(np.asarray(loss.data)))
    return dict(losses=losses, grads=grads,
                weights={n: p.data.copy() for n, p in model.named_parameters()})


def _layouts(model):
    return {n: tuple(str(q) for q in p.placements) for n, p in model.named_parameters()
            if hasattr(p, "placements")}


def _boxes(model):
    return {n: p._spec.local_shape_and_offset() for n, p in model.named_parameters()
            if hasattr(p, "_spec")}


def _worker():
    from minidist import nn
    from minidist.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
    from minidist.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )
    from minidist.parallel.tensor import ColumnParallelLinear, RowParallelLinear, packed_rows
    from minidist.parallel.tensor.gpt import tensor_parallel_gpt

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    out = {}

    # the MLP three ways
    out["mlp_whole"] = _train_mlp(_mlp())
    model = parallelize_module(_mlp(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    out["mlp_layouts"], out["mlp_boxes"] = _layouts(model), _boxes(model)
    out["mlp_types"] = {n: type(p).__name__ for n, p in model.named_parameters()}
    out["mlp_dtensor"] = _train_mlp(model)
    by_hand = _mlp()
    by_hand.fc1 = ColumnParallelLinear.from_linear(by_hand.fc1)
    by_hand.fc2 = RowParallelLinear.from_linear(by_hand.fc2)
    out["mlp_split"] = _train_mlp(by_hand)

    # the messages of each style, one traced region per pass
    col = parallelize_module(nn.Linear(8, 12, rng=1, dtype=np.float64), mesh, ColwiseParallel())
    row = parallelize_module(nn.Linear(12, 8, rng=2, dtype=np.float64), mesh, RowwiseParallel())
    x = Tensor(_mlp_data(0)[0], requires_grad=True)
    with trace.region("colwise forward"):
        h = col(x)
    with trace.region("colwise backward"):
        h.sum().backward()
    hl = Tensor(h.data.copy(), requires_grad=True)
    with trace.region("rowwise forward"):
        y = row(hl)
    with trace.region("rowwise backward"):
        y.sum().backward()

    # uneven: Linear(10, 33) colwise, then Linear(33, 5) rowwise
    wide = nn.Linear(10, 33, rng=3, dtype=np.float64)
    narrow = nn.Linear(33, 5, rng=4, dtype=np.float64)
    xu = np.random.default_rng(5).standard_normal((4, 10))
    whole_u = F.linear(F.linear(Tensor(xu), wide.weight, wide.bias), narrow.weight, narrow.bias)
    parallelize_module(wide, mesh, ColwiseParallel())
    parallelize_module(narrow, mesh, RowwiseParallel())
    local = wide(Tensor(xu))
    out["uneven"] = dict(rows=wide.weight.data.shape[0], local_width=local.data.shape[-1],
                         bias=wide.bias.data.shape[0],
                         error=float(np.abs(narrow(local).data - whole_u.data).max()))

    # SequenceParallel on a LayerNorm
    ln_whole = nn.LayerNorm(8, dtype=np.float64)
    ln_whole.weight.data[:] = np.linspace(0.5, 1.5, 8)
    ln = nn.LayerNorm(8, dtype=np.float64)
    ln.weight.data[:] = ln_whole.weight.data
    xs = np.random.default_rng(6).standard_normal((2, 8, 8))
    g = np.random.default_rng(7).standard_normal((2, 8, 8))
    (ln_whole(Tensor(xs)) * Tensor(g)).sum().backward()
    parallelize_module(ln, mesh, SequenceParallel())
    piece = 8 // world
    ys = ln(Tensor(xs[:, rank * piece:(rank + 1) * piece]))
    (ys.to_local() * Tensor(g[:, rank * piece:(rank + 1) * piece])).sum().backward()
    out["sp"] = dict(placements=str(ys.placements), weight_layout=str(ln.weight.placements),
                     value=float(np.abs(ys.full_tensor().data - ln_whole(Tensor(xs)).data).max()),
                     weight_grad=float(np.abs(ln.weight.grad - ln_whole.weight.grad).max()),
                     bias_grad=float(np.abs(ln.bias.grad - ln_whole.bias.grad).max()))

    # a sequence-parallel MLP: LayerNorm on Shard(1) tokens, Colwise taking Shard(1) (an
    # all_gather), Rowwise leaving Shard(1) (a reduce_scatter); PrepareModuleInput and
    # PrepareModuleOutput on a module of its own
    whole_mlp, sp_mlp = _mlp(), _mlp()
    xw = np.random.default_rng(8).standard_normal((2, 4 * world, 8))
    ln_whole.zero_grad()
    (whole_mlp(ln_whole(Tensor(xw))) * Tensor(xw)).sum().backward()
    ln2 = nn.LayerNorm(8, dtype=np.float64)
    ln2.weight.data[:] = ln_whole.weight.data
    parallelize_module(ln2, mesh, SequenceParallel())
    parallelize_module(sp_mlp, mesh, {
        "fc1": ColwiseParallel(input_layouts=Shard(1)),
        "fc2": RowwiseParallel(output_layouts=Shard(1))})
    part = slice(4 * rank, 4 * rank + 4)
    with trace.region("sp forward"):
        ysp = sp_mlp(ln2(Tensor(xw[:, part])))
    (ysp * Tensor(xw[:, part])).sum().backward()
    prepared = parallelize_module(nn.Identity(), mesh, PrepareModuleInput(
        input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True))
    gathered = prepared(Tensor(xw[:, part]))
    out_prepared = parallelize_module(nn.Identity(), mesh, PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(0)))
    halves = out_prepared(Tensor(xw))
    out["sp_mlp"] = dict(
        value=float(np.abs(ysp.data - whole_mlp(ln_whole(Tensor(xw))).data[:, part]).max()),
        fc1_grad=float(np.abs(sp_mlp.fc1.weight.grad - _piece(
            whole_mlp.fc1.weight.grad, sp_mlp.fc1.weight._spec.local_shape_and_offset())).max()),
        ln_grad=float(np.abs(ln2.weight.grad - ln_whole.weight.grad).max()),
        gathered=float(np.abs(gathered.data - xw).max()), plain=type(gathered).__name__,
        halves=halves.data.shape)

    # the GPT three ways
    def whole_loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), targets.reshape(-1))

    def parallel_loss(logits, targets):
        sharded = DTensor.from_local(logits, mesh, [Shard(-1)])
        with loss_parallel():
            return F.cross_entropy(sharded.reshape(-1, CONFIG.vocab_size), targets.reshape(-1))

    out["gpt_whole"] = _train_gpt(GPT(CONFIG, rng=0).to(np.float64), whole_loss)
    gpt = _torch_plan(GPT(CONFIG, rng=0).to(np.float64), mesh)
    out["gpt_layouts"], out["gpt_boxes"] = _layouts(gpt), _boxes(gpt)
    out["gpt_dtensor"] = _train_gpt(gpt, parallel_loss)
    split = tensor_parallel_gpt(GPT(CONFIG, rng=0).to(np.float64))
    out["gpt_split"] = _train_gpt(split, split.loss)
    out["qkv_rows"] = packed_rows(3 * CONFIG.n_embd, 3, rank, world)
    return out


def _bad_batch():
    """Rank 1 feeds a Rowwise Linear a batch of another size: its forward's
    all_reduce does not fit the others'."""
    from minidist import nn
    from minidist.distributed.tensor import init_device_mesh
    from minidist.parallel import RowwiseParallel, parallelize_module

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    row = parallelize_module(nn.Linear(4 * world, 3, rng=0), mesh, RowwiseParallel())
    rows = 5 if dist.get_rank() == 1 else 2
    row(Tensor(np.ones((rows, 4), np.float32)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("placements_styles")
    outcome = {}
    for world, transport in RUNS:
        path = folder / f"{world}{transport}.jsonl"
        results = minidist.launch(_worker, world_size=world, transport=transport,
                                  trace=str(path), timeout=240)
        outcome[(world, transport)] = (results, trace.read_jsonl(path).events)
    return outcome


def _piece(whole, box):
    shape, offset = box
    return whole[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.blas_kernel
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("key", RUNS)
def test_the_mlp_on_dtensors_trains_as_one_process_and_as_the_split_layers(runs, key):
    for r in runs[key][0]:
        assert r["mlp_layouts"] == {"fc1.weight": ("S(0)",), "fc1.bias": ("S(0)",),
                                    "fc2.weight": ("S(1)",), "fc2.bias": ("R",)}
        assert set(r["mlp_types"].values()) == {"DTensorParameter"}
        whole, mine, split = r["mlp_whole"], r["mlp_dtensor"], r["mlp_split"]
        _close(mine["losses"], whole["losses"])
        _close(mine["losses"], split["losses"])
        for name, box in r["mlp_boxes"].items():
            _close(mine["grads"][name], _piece(whole["grads"][name], box))
            _close(mine["weights"][name], _piece(whole["weights"][name], box))
            _close(mine["weights"][name], split["weights"][name])


def _pick(r, name, whole):
    """This rank's piece of a whole array: a DTensor's box, c_attn's packed rows."""
    if name in r["gpt_boxes"]:
        return _piece(whole, r["gpt_boxes"][name])
    return whole[r["qkv_rows"]] if ".c_attn." in name else whole


@pytest.mark.blas_kernel
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("key", RUNS)
def test_the_gpt_under_torchs_plan_trains_as_one_process_and_as_the_split_layers(runs, key):
    world = key[0]
    for r in runs[key][0]:
        layouts = r["gpt_layouts"]
        assert layouts["transformer.wte.weight"] == ("S(0)",)
        assert layouts["transformer.h.0.mlp.c_fc.weight"] == ("S(0)",)
        assert layouts["transformer.h.1.attn.c_proj.weight"] == ("S(1)",)
        assert layouts["transformer.h.1.attn.c_proj.bias"] == ("R",)
        assert "transformer.h.0.attn.c_attn.weight" not in layouts   # the split layer
        whole, mine, split = r["gpt_whole"], r["gpt_dtensor"], r["gpt_split"]
        assert set(mine["weights"]) == set(whole["weights"])
        _close(mine["losses"], whole["losses"])
        _close(mine["losses"], split["losses"])
        for name in whole["weights"]:
            _close(mine["grads"][name], _pick(r, name, whole["grads"][name]))
            _close(mine["weights"][name], _pick(r, name, whole["weights"][name]))
    assert world in (2, 4)


@pytest.mark.blas_kernel
@pytest.mark.timeout(900)
@pytest.mark.parametrize("key", RUNS)
def test_uneven_out_features_and_sequence_parallel(runs, key):
    world = key[0]
    sizes = {2: [17, 16], 4: [9, 9, 9, 6]}[world]
    for rank, r in enumerate(runs[key][0]):
        u = r["uneven"]
        assert u["rows"] == u["local_width"] == u["bias"] == sizes[rank]
        assert u["error"] < 1e-12
        sp = r["sp"]
        assert sp["placements"] == "(Shard(dim=1),)" and sp["weight_layout"] == "(Replicate(),)"
        assert max(sp["value"], sp["weight_grad"], sp["bias_grad"]) < 1e-12
        m = r["sp_mlp"]
        assert max(m["value"], m["fc1_grad"], m["ln_grad"], m["gathered"]) < 1e-12
        assert m["plain"] == "Tensor"
        assert m["halves"] == ({2: [1, 1], 4: [1, 1, 0, 0]}[world][rank], 4 * world, 8)


def _called(events, rank, regions, label):
    start, end = regions[label]
    return [trace.label_info(e["label"])["collective"] for e in events
            if e["rank"] == rank and e["kind"] == "collective"
            and start <= e["start"] and e["end"] <= end]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("key", RUNS)
def test_the_messages_are_the_tables(runs, key):
    _, events = runs[key]
    world = key[0]
    for rank in range(world):
        regions = {e["label"]: (e["start"], e["end"]) for e in events
                   if e["rank"] == rank and e["kind"] == "compute"}

        assert _called(events, rank, regions, "colwise forward") == []
        assert _called(events, rank, regions, "colwise backward") == ["all_reduce"]
        assert _called(events, rank, regions, "rowwise forward") == ["all_reduce"]
        assert _called(events, rank, regions, "rowwise backward") == []
        assert _called(events, rank, regions, "sp forward") == ["all_gather", "reduce_scatter"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_a_rank_that_fails_inside_a_rowwise_all_reduce_is_named(transport):
    with pytest.raises(WorkerError) as caught:
        minidist.launch(_bad_batch, world_size=2, transport=transport, timeout=60)
    assert "rank 1" in str(caught.value).splitlines()[0]
