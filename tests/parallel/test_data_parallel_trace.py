"""What the trace of data-parallel training shows (lesson 5):

* DDP overlaps communication with backward: a bucket's all_reduce starts
  before the backward pass that produced it has ended;
* the coordinator's traffic grows with the number of workers (it receives
  every worker's gradients and sends every worker the weights), while the
  ring all_reduce keeps every rank's traffic near twice the model's size.

Counted from the traced messages, checked against the formulas.
"""

from __future__ import annotations

import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.data.coordinator import CoordinatorDataParallel
from minidist.parallel.data.ddp import DistributedDataParallel

STEPS = 3


def _model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def _model_bytes() -> int:
    return sum(p.data.nbytes for p in _model().parameters())


def _train(flavour):
    rank = dist.get_rank()
    x, y = load_digits()[:2]
    model = _model()
    loss_fn = nn.CrossEntropyLoss()
    # Backward reaches the first layer last: mark when its gradients are ready
    # (hooked before DDP's own hooks, so the mark comes before DDP reacts).
    for parameter in list(model.parameters())[:2]:
        parameter.register_post_accumulate_grad_hook(
            lambda tensor: trace.record("mark", trace.now(), trace.now(),
                                        label="first layer's gradient ready"))
    if flavour in ("ddp", "ddp-no-overlap"):
        wrapped = DistributedDataParallel(model, bucket_cap_mb=0.01,
                                          overlap=flavour == "ddp", algorithm="ring")
        optimizer = optim.SGD(wrapped.parameters(), lr=0.1)
    else:
        optimizer = optim.SGD(model.parameters(), lr=0.1)
        wrapped = CoordinatorDataParallel(model, optimizer)
    for step in range(STEPS):
        start = (step * dist.get_world_size() + rank) * 16
        xs, ys = x[start:start + 16], y[start:start + 16]
        optimizer.zero_grad()
        with trace.region(f"forward step {step}"):
            out = model(Tensor(xs)) if flavour == "coordinator" else wrapped(Tensor(xs))
            loss = loss_fn(out, ys)
        with trace.region(f"backward step {step}"):
            loss.backward()
        if flavour == "coordinator":
            wrapped.step(batch_size=len(xs))
        else:
            optimizer.step()


def _events(tmp_path, flavour, world_size):
    path = tmp_path / f"{flavour}{world_size}.jsonl"
    minidist.launch(_train, world_size=world_size, transport="shm", args=(flavour,),
                    trace=str(path))
    return trace.read_jsonl(path).events


def _all_reduces_before_the_last_gradient(events, rank) -> int:
    """How many steps have an all_reduce that started before backward had
    produced its last gradient (the first layer's): communication overlapping
    the rest of backward."""
    backwards = [e for e in events if e["rank"] == rank and e["kind"] == "compute"
                 and e["label"].startswith("backward")]
    marks = [e["start"] for e in events if e["rank"] == rank and e["kind"] == "mark"]
    calls = [e["start"] for e in events if e["rank"] == rank and e["kind"] == "collective"
             and trace.label_info(e["label"]).get("collective") == "all_reduce"]
    assert len(backwards) == STEPS and len(marks) == 2 * STEPS
    overlapping = 0
    for backward in backwards:
        last = max(m for m in marks if backward["start"] <= m <= backward["end"])
        overlapping += any(backward["start"] <= c < last for c in calls)
    return overlapping


@pytest.mark.timeout(120)
def test_ddp_starts_all_reduces_while_backward_still_computes(tmp_path):
    overlapped = _events(tmp_path, "ddp", 2)
    serial = _events(tmp_path, "ddp-no-overlap", 2)
    for rank in range(2):
        assert _all_reduces_before_the_last_gradient(overlapped, rank) == STEPS
        # Without overlap every all_reduce waits for the whole backward pass.
        assert _all_reduces_before_the_last_gradient(serial, rank) == 0


def _bytes(events, rank, kind, collective=""):
    """Bytes of the collectives' messages of one rank (of one collective, if named)."""
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == kind
               and trace.label_info(e["label"]).get("call") is not None
               and e["label"].startswith(collective))


@pytest.mark.timeout(180)
def test_coordinator_traffic_grows_with_workers_and_ring_traffic_does_not(tmp_path):
    model = _model_bytes()
    for world_size in (2, 4):
        events = _events(tmp_path, "coordinator", world_size)
        # Per step the coordinator receives every other rank's gradients (plus an
        # 8-byte example count each) and sends every other rank the weights.
        received = _bytes(events, 0, "recv") / STEPS
        sent = _bytes(events, 0, "send") / STEPS
        others = world_size - 1
        assert received == pytest.approx(others * model, rel=0.01)
        assert sent >= others * model
        events = _events(tmp_path, "ddp", world_size)
        # Ring all_reduce: each rank sends and receives 2 (n - 1) / n of the model
        # per step (plus the 8-byte example count, all-reduced once a step); the
        # weights broadcast once at the start are not part of a step.
        expected = 2 * (world_size - 1) / world_size * model
        for rank in range(world_size):
            per_step = _bytes(events, rank, "send", "all_reduce") / STEPS
            assert per_step == pytest.approx(expected, rel=0.02), (world_size, rank)
