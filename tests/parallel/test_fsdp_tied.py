"""FSDP trains a model whose layers share one Parameter: a GPT's tied embedding.

The GPT's token embedding is also its output layer (``lm_head.weight`` is
``transformer.wte.weight``), so the Parameter is held by two layers; FSDP
puts it in one unit, the GPT's own (minidist.parallel.data.fsdp_units).

One launch per world size (2 and 4) and transport (pipe and shm) runs every
case in the workers; each rank trains on its share of a global batch (the
last rank's share smaller, so the example counts weigh the average):

* each sharding strategy trains the GPT STEPS steps with SGD and momentum;
  every rank ends with the weights of one process's training on the whole
  batch, within float32 round-off (atol 1e-6, as tests/parallel/test_zero.py
  holds FSDP to DDP);
* the tie holds: in every step's forward the embedding and the output layer
  are served the same array; the GPT is the one unit that holds it;
* the memory ledger counts it once: the units hold the model's parameters
  (the tied one once) and the ledger measures exactly their shards;
* a checkpoint round-trips, the momentum with it (each strategy): load, then
  the same step, bit for bit;
* a Parameter tied between two items of a ModuleList (which has no forward
  to hook) trains as one process does, owned by the module that calls them;
* two different Parameters over one array are refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, nn, optim
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.data.checkpoint_files import load_checkpoint, save_checkpoint
from minidist.parallel.data.fsdp import STRATEGIES, FullyShardedDataParallel

CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
STEPS = 4
BATCH_PER_RANK = 3


def _shares(world_size):
    sizes = [BATCH_PER_RANK] * world_size
    sizes[-1] -= 1
    return np.cumsum([0] + sizes)


def _global_batches(world_size):
    """STEPS batches of (token ids, next tokens), the whole global batch each."""
    rng = np.random.default_rng(7)
    total = int(_shares(world_size)[-1])
    tokens = rng.integers(0, CONFIG.vocab_size, (STEPS, total, CONFIG.block_size + 1))
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _loss(logits, targets):
    return nn.CrossEntropyLoss()(logits.reshape(-1, CONFIG.vocab_size), targets.reshape(-1))


def _gpt():
    return GPT(CONFIG, rng=0)


class _TiedList(nn.Module):
    """Two Linear layers in a ModuleList, the second's weight the first's,
    between two more. The unit holding the tied weight, this module's own,
    comes first, before ``first``: ``full_weights()`` is in the order of
    ``parameters()`` all the same."""

    def __init__(self):
        super().__init__()
        nn.init.manual_seed(0)
        self.first = nn.Linear(5, 6)
        self.layers = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 6)])
        self.layers[1].weight = self.layers[0].weight
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = self.first(x)
        for layer in self.layers:
            x = layer(x).tanh()
        return self.head(x)


def _list_batches(world_size):
    rng = np.random.default_rng(3)
    total = int(_shares(world_size)[-1])
    return [(rng.standard_normal((total, 5)).astype(np.float32), rng.integers(0, 3, total))
            for _ in range(STEPS)]


def _train(model, batches, loss_fn, wrap=None, rank=0, world_size=1, each_step=None):
    """Train with SGD and momentum on rank ``rank``'s share of each batch."""
    wrapped = model if wrap is None else wrap(model)
    optimizer = optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    lo, hi = _shares(world_size)[rank:rank + 2] if wrap is not None else (None, None)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(wrapped(Tensor(x[lo:hi])), y[lo:hi]).backward()
        optimizer.step()
        if each_step is not None:
            each_step()
    return wrapped, optimizer


def _one_process(world_size):
    """The references: each model trained in one process on the whole batches."""
    gpt, _ = _train(_gpt(), _global_batches(world_size), _loss)
    tied, _ = _train(_TiedList(), _list_batches(world_size), nn.CrossEntropyLoss())
    return ([p.data.copy() for p in gpt.parameters()],
            [p.data.copy() for p in tied.parameters()])


def _served_by_one_array(model):
    """Forward pre-hooks that record, per forward, whether the output layer
    computes with the very array the embedding used."""
    served, same = [], []
    model.transformer.wte.register_forward_pre_hook(
        lambda layer, args: served.append(layer.weight.data))
    model.lm_head.register_forward_pre_hook(
        lambda layer, args: same.append(layer.weight.data is served[-1]))
    return same


def _gpt_case(strategy, path):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _gpt()
    parameters = model.num_parameters()    # the tied matrix once (read now: FULL_SHARD frees)
    same = _served_by_one_array(model)
    tied = []
    wrap = (lambda m: FullyShardedDataParallel(m, sharding_strategy=strategy))
    fsdp, optimizer = _train(model, _global_batches(world_size), _loss, wrap, rank, world_size,
                             each_step=lambda: tied.append(
                                 model.lm_head.weight is model.transformer.wte.weight))
    weights = fsdp.full_weights()
    holders = [unit.module for unit in fsdp._units
               for p in unit.layout.parameters if p is model.transformer.wte.weight]
    ledger = memory.Ledger(fsdp, optimizer, rank=rank)
    measured = ledger.measure()["parameters"]
    layouts = [unit.layout for unit in fsdp._units]
    kept = [lay.padded if strategy == "SHARD_GRAD_OP" else lay.shard for lay in layouts]
    out = dict(weights=weights, same=same[:], tied=tied, holders_are_gpt=[h is model for h in holders],
               numel=sum(lay.numel for lay in layouts), parameters=parameters,
               measured=measured, expected=4 * sum(kept), units=len(layouts))
    x, y = _global_batches(world_size)[0]
    lo, hi = _shares(world_size)[rank:rank + 2]

    def step():
        optimizer.zero_grad()
        _loss(fsdp(Tensor(x[lo:hi])), y[lo:hi]).backward()
        optimizer.step()
        return fsdp.full_weights()

    save_checkpoint(path, fsdp, optimizer)
    continued = step()
    load_checkpoint(path, fsdp, optimizer)
    out["checkpoint"] = all(np.array_equal(a, b) for a, b in zip(step(), continued))
    return out


def _refusal():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = nn.Parameter(model[0].weight.data)     # one array, two Parameters
    try:
        FullyShardedDataParallel(model)
    except ValueError as error:
        return str(error)
    return None


def _worker(path):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = {"gpt": {s: _gpt_case(s, f"{path}-{s}.npz") for s in STRATEGIES}, "list": {}}
    for strategy in STRATEGIES:
        wrap = (lambda m, s=strategy: FullyShardedDataParallel(m, sharding_strategy=s))
        fsdp, _ = _train(_TiedList(), _list_batches(world_size), nn.CrossEntropyLoss(), wrap,
                         rank, world_size)
        out["list"][strategy] = fsdp.full_weights()
    out["refusal"] = _refusal()
    return out


@pytest.mark.blas_kernel
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size,transport", [(2, "pipe"), (2, "shm"), (4, "pipe"),
                                                  (4, "shm")])
def test_fsdp_trains_a_tied_gpt_as_one_process_does(tmp_path, world_size, transport):
    gpt_reference, list_reference = _one_process(world_size)
    results = minidist.launch(_worker, world_size=world_size, transport=transport,
                              args=(str(tmp_path / "tied"),), timeout=180)
    for rank, result in enumerate(results):
        for strategy, case in result["gpt"].items():
            label = (rank, strategy, world_size, transport)
            assert len(case["weights"]) == len(gpt_reference), label
            for got, expected in zip(case["weights"], gpt_reference):
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, err_msg=str(label))
            assert case["same"] == [True] * STEPS and case["tied"] == [True] * STEPS, label
            assert case["holders_are_gpt"] == [True], label
            assert case["numel"] == case["parameters"], label
            assert case["measured"] == case["expected"], label
            assert case["checkpoint"], label
        for strategy, weights in result["list"].items():
            assert len(weights) == len(list_reference), (rank, strategy)
            for got, expected in zip(weights, list_reference):
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6,
                                           err_msg=str((rank, strategy)))
        message = result["refusal"]
        assert message is not None and "\n" not in message, message
        assert message.startswith(f"rank {rank}: FullyShardedDataParallel: 0.weight and "
                                  "1.weight are two Parameters over the same memory"), message
        assert "tie them as one Parameter (assign the same Parameter to both layers" in message
