# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 5: data parallel training, with a coordinator and with all_reduce
#
# Data parallelism is the simplest way to train on several workers: every
# worker holds a full copy of the model, each one computes gradients on its
# own slice ("shard") of the batch, and the workers then agree on one
# gradient before they update. If they agree on the *average* gradient, the
# update is exactly the one a single process would make on the whole batch,
# so the copies never drift apart.
#
# This chapter:
#
# 1. does one step by hand: shard gradients, `all_reduce` with AVG, compare
#    with the full-batch gradient;
# 2. trains on the bundled digits with 2 workers, first through a
#    coordinator, then with all_reduce (`DistributedDataParallel`), and
#    checks the weights against single-process training;
# 3. counts, from a trace, the bytes the coordinator receives against the
#    bytes one ring rank sends, for 2 and 4 workers;
# 4. draws the timeline of a DDP step to see communication start while
#    backward is still running (overlap);
# 5. makes one worker slower and measures how every synchronous step waits
#    for it (stragglers).
#
# The library code is `minidist/parallel/data/coordinator.py` and
# `minidist/parallel/data/ddp.py`; their docstrings say the same things in
# more detail.

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import DistributedSampler, load_digits
from minidist.lesson import (
    glue,
    glued,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    show_file,
    use_headless_matplotlib,
)
from minidist.parallel.data.coordinator import CoordinatorDataParallel
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.parameter_server.straggler import Straggler
from minidist.parallel.replicas import broadcast_module
from minidist.tensor import no_grad

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

from viz.timeline import save_timeline  # noqa: E402

QUICK = quick()
OUT = output_dir()

x_train, y_train, x_test, y_test = load_digits()
print(f"digits: {len(x_train)} training images, {len(x_test)} test images, 64 pixels each")

# %% jupyter={"source_hidden": true}
if QUICK:
    say("""
*This is the quick form of the lesson.* It trains for 2 epochs in section 2
(the full form: 10) and times 4 straggler steps per run in section 5 (the
full form: 10); everything else is the same. Its accuracies are therefore
lower than the full form's, and its medians rest on fewer steps.
""")


def make_model(seed=0, hidden=32):
    """A small multilayer perceptron for the 8x8 digits."""
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def flat_weights(model):
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


# %% [markdown]
# ## 1. One step by hand
#
# Take a batch of 64 images. The single-process gradient is the gradient of
# the mean loss over all 64. With 2 workers, worker r takes images
# 32 r .. 32 r + 31 and computes the gradient of the mean loss over its 32.
# The mean over 64 is the average of the two means over 32 (the shards have
# the same size), and the gradient of an average is the average of the
# gradients. So one `all_reduce(grad, op=AVG)` per parameter gives every
# worker the full-batch gradient.
#
# `broadcast_module` first copies rank 0's weights to every rank: each
# worker builds its model with a different seed here, on purpose, and
# without the broadcast they would not be training the same model.

# %%
BATCH = 64


def one_step_by_hand():
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=rank)          # different on every rank...
    broadcast_module(model, src=0)         # ...until rank 0's weights are copied
    shard = BATCH // world
    xs = x_train[rank * shard:(rank + 1) * shard]
    ys = y_train[rank * shard:(rank + 1) * shard]
    nn.CrossEntropyLoss()(model(Tensor(xs)), ys).backward()
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)
    return [param.grad.copy() for param in model.parameters()]


averaged = minidist.launch(one_step_by_hand, world_size=2, transport="shm")

reference = make_model(seed=0)
nn.CrossEntropyLoss()(reference(Tensor(x_train[:BATCH])), y_train[:BATCH]).backward()
difference = max(np.abs(g - p.grad).max() for g, p in zip(averaged[0], reference.parameters()))
same_on_ranks = all(np.array_equal(a, b) for a, b in zip(averaged[0], averaged[1]))
print(f"largest difference from the full-batch gradient: {difference:.2e} (float32 rounding)")
print("both ranks hold identical bits:", same_on_ranks)

# %% [markdown]
# The difference is rounding only: the sum is taken in another order. (With
# shards of *different* sizes a plain average is wrong: the smaller shard
# would weigh too much. The library weights each rank by its number of
# examples; see the docstring of `minidist/parallel/data/coordinator.py`.)
#
# ## 2. Training on the digits with 2 workers
#
# Each worker reads its part of every epoch through a `DistributedSampler`:
# all ranks shuffle with the same seed and epoch, so they agree on one order
# without talking, and rank r keeps every second index starting at r. Each
# step, rank r takes the next 32 of its indices; the global batch is 64.
#
# Two flavours of the same training:
#
# * **coordinator** (`CoordinatorDataParallel`): every worker sends its
#   gradient to rank 0, rank 0 averages and runs the optimizer, then sends
#   the new weights back to everyone;
# * **all_reduce** (`DistributedDataParallel`, "DDP"): every rank
#   all-reduces the gradients and runs the same optimizer step itself.
#
# In the DDP loop nothing calls all_reduce explicitly: the wrapper hooks
# into backward and does it there (section 4 shows when).

# %%
WORLD = 2
PER_RANK = 32
EPOCHS = 2 if QUICK else 10
LR = 0.1


def shard_batches(rank, world, epoch):
    """This rank's batches of one epoch, from the DistributedSampler."""
    sampler = DistributedSampler(len(x_train), num_replicas=world, rank=rank, shuffle=True,
                                 seed=0)
    sampler.set_epoch(epoch)
    order = sampler.indices()
    return [order[i:i + PER_RANK] for i in range(0, len(order), PER_RANK)]


def accuracy(model):
    with no_grad():
        predicted = model(Tensor(x_test)).data.argmax(axis=1)
    return float((predicted == y_test).mean())


def train(flavour):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=rank)          # both wrappers broadcast rank 0's weights
    loss_fn = nn.CrossEntropyLoss()
    if flavour == "coordinator":
        optimizer = optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        wrapper = CoordinatorDataParallel(model, optimizer)
        forward = model
    else:
        wrapper = DistributedDataParallel(model, algorithm="ring")
        optimizer = optim.SGD(wrapper.parameters(), lr=LR, momentum=0.9)
        forward = wrapper
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        for indices in shard_batches(rank, world, epoch):
            optimizer.zero_grad(set_to_none=False)
            loss_fn(forward(Tensor(x_train[indices])), y_train[indices]).backward()
            if flavour == "coordinator":
                wrapper.step(batch_size=len(indices))
            else:
                optimizer.step()
    seconds = time.perf_counter() - start
    return flat_weights(model), accuracy(model), seconds


def train_single_process():
    """The reference: one process, one step on each global batch (both shards together)."""
    model = make_model(seed=0)
    optimizer = optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        shards = [shard_batches(rank, WORLD, epoch) for rank in range(WORLD)]
        for step in zip(*shards):
            indices = np.concatenate(step)
            optimizer.zero_grad()
            loss_fn(model(Tensor(x_train[indices])), y_train[indices]).backward()
            optimizer.step()
    return flat_weights(model), accuracy(model), time.perf_counter() - start


single_weights, single_accuracy, single_seconds = train_single_process()
print(f"single process, {EPOCHS} epochs: test accuracy {single_accuracy:.3f}, "
      f"{glue('single_seconds', single_seconds, '{:.2f} s')}")
flavours = {}
for flavour in ("coordinator", "ddp"):
    results = minidist.launch(train, world_size=WORLD, transport="shm", args=(flavour,))
    weights, acc, seconds = results[0]
    identical = all(np.array_equal(weights, r[0]) for r in results)
    gap = np.abs(weights - single_weights).max()
    flavours[flavour] = (acc, seconds, identical, gap)
    print(f"{flavour:>11}: rank 0 test accuracy {acc:.3f}, {seconds:.2f} s; "
          f"ranks identical: {identical}; max |w - w_single| = {gap:.1e}")

# What the text below says of these runs, chosen from their numbers.
STEPS_RUN = EPOCHS * len(shard_batches(0, WORLD, 0))
glue("coordinator_seconds", flavours["coordinator"][1], "{:.2f} s")
glue("ddp_seconds", flavours["ddp"][1], "{:.2f} s")
accuracy_gap = max(abs(acc - single_accuracy) for acc, _, _, _ in flavours.values())
largest_gap = max(gap for _, _, _, gap in flavours.values())
glue("single_accuracy", single_accuracy, ".3f")
glue("accuracy_gap", accuracy_gap, ".3f")
glue("accuracy_verdict", "reach the single-process accuracy" if accuracy_gap == 0
     else "end within " + glued("accuracy_gap") + " of the single-process accuracy")
glue("largest_gap", largest_gap, ".1e")
glue("gap_verdict", "up to float32 rounding" if largest_gap < 1e-4 else "only roughly")
glue("identical_verdict", "hold bit-identical weights"
     if all(same for _, _, same, _ in flavours.values()) else "do not hold identical weights")
glue("speed_verdict", "are not faster"
     if min(seconds for _, seconds, _, _ in flavours.values()) >= single_seconds
     else "were faster this time")
glue("single_step_ms", single_seconds / STEPS_RUN * 1e3, "{:.2f} ms")
glue("steps_run", STEPS_RUN, ",")

# %% jupyter={"source_hidden": true}
say("""
Both flavours {glue}`accuracy_verdict` ({glue}`single_accuracy`), and their
weights match the single-process weights {glue}`gap_verdict` at the end of
training (largest difference {glue}`largest_gap`); the two ranks
{glue}`identical_verdict`. That is the whole promise of synchronous data
parallelism: the same training, the work split. (Rounding differences can
grow slowly over many steps; they are differences in the last bits, not in
what is learnt.)

On this machine the parallel runs {glue}`speed_verdict`: the single process
took {glue}`single_seconds`, the coordinator {glue}`coordinator_seconds` and
DDP {glue}`ddp_seconds`. The model is tiny: one step of the single process
(a batch of 64) took {glue}`single_step_ms` on average over its
{glue}`steps_run` steps, and 2 workers plus their messages share 2 cores.
Data parallelism pays when the compute per step is large compared with the
time to move the gradients.
""")

# %% [markdown]
# ## 3. Who sends how much?
#
# With N the size of the model's gradient in bytes (the message every
# worker sends) and n workers, per step:
#
# * the coordinator **receives** a gradient from each of the n - 1 others,
#   (n - 1) N, and sends the weights back, (n - 1) N more. Its link carries
#   n - 1 times what any worker's does, so it is the bottleneck as n grows;
# * with the ring all_reduce, **every** rank sends 2 (n - 1) / n N: under
#   2 N whatever n is, and no rank is special.
#
# We count it in a trace: every message of every rank is written down, and
# `trace.label_info` tells which collective call a message belongs to.

# %%
TRACE_STEPS = 3


def traffic_model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def train_traced(flavour):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = traffic_model()
    loss_fn = nn.CrossEntropyLoss()
    if flavour == "coordinator":
        optimizer = optim.SGD(model.parameters(), lr=LR)
        wrapper = CoordinatorDataParallel(model, optimizer)
    else:
        wrapper = DistributedDataParallel(model, bucket_cap_mb=0.01, algorithm="ring")
        optimizer = optim.SGD(wrapper.parameters(), lr=LR)
    for step in range(TRACE_STEPS):
        start = (step * world + rank) * 16
        xs, ys = x_train[start:start + 16], y_train[start:start + 16]
        optimizer.zero_grad(set_to_none=False)
        if flavour == "coordinator":
            loss_fn(model(Tensor(xs)), ys).backward()
            wrapper.step(batch_size=len(xs))
        else:
            loss_fn(wrapper(Tensor(xs)), ys).backward()
            optimizer.step()


def collective_bytes(events, rank, kind, collective=""):
    """Bytes of one rank's messages of kind "send" or "recv" that belong to a
    collective call (whose label starts with ``collective``, if given)."""
    return sum(e["bytes"] for e in events
               if e["rank"] == rank and e["kind"] == kind
               and trace.label_info(e["label"]).get("call") is not None
               and e["label"].startswith(collective))


N = sum(p.data.nbytes for p in traffic_model().parameters())
print(f"model: {N} bytes of float32 parameters (N)")
traffic, count_bytes = {}, {}
for n in (2, 4):
    path = OUT / f"coordinator{n}.trace.jsonl"
    minidist.launch(train_traced, world_size=n, transport="shm", args=("coordinator",),
                    trace=str(path))
    events = trace.read_jsonl(path).events
    coordinator_in = collective_bytes(events, 0, "recv") / TRACE_STEPS
    path = OUT / f"ddp{n}.trace.jsonl"
    minidist.launch(train_traced, world_size=n, transport="shm", args=("ddp",),
                    trace=str(path))
    events = trace.read_jsonl(path).events
    busiest = max(range(n), key=lambda r: collective_bytes(events, r, "send", "all_reduce"))
    ring_out = collective_bytes(events, busiest, "send", "all_reduce") / TRACE_STEPS
    # DDP's example count goes in its own small all_reduce (one-shot: to every other rank)
    count_out = collective_bytes(events, busiest, "send", "all_reduce one_shot") / TRACE_STEPS
    traffic[n] = (coordinator_in, ring_out)
    count_bytes[n] = count_out
    print(f"n={n}: coordinator receives {coordinator_in:9,.0f} B/step, (n-1)N = {(n - 1) * N:9,}; "
          f"one ring rank sends {ring_out:9,.0f} B/step, 2(n-1)/n N = {2 * (n - 1) / n * N:9,.0f}")
    print(f"     of the ring rank's bytes: {count_out:,.0f} B the example count's all_reduce, "
          f"{ring_out - count_out:,.0f} B the buckets' "
          f"({ring_out - count_out - 2 * (n - 1) / n * N:,.0f} B above the formula)")

above = [measured - formula for n, (coordinator_in, ring_out) in traffic.items()
         for measured, formula in ((coordinator_in, (n - 1) * N), (ring_out, 2 * (n - 1) / n * N))]
glue("bytes_above_least", min(above), ",.0f")
glue("bytes_above_most", max(above), ",.0f")
coordinator_above = {n: c - (n - 1) * N for n, (c, _) in traffic.items()}
bucket_above = {n: r - count_bytes[n] - 2 * (n - 1) / n * N for n, (_, r) in traffic.items()}
glue("coordinator_above_2", coordinator_above[2], ",.0f")
glue("coordinator_above_4", coordinator_above[4], ",.0f")
glue("count_bytes_2", count_bytes[2], ",.0f")
glue("count_bytes_4", count_bytes[4], ",.0f")
glue("bucket_above_2", bucket_above[2], ",.0f")
glue("bucket_above_4", bucket_above[4], ",.0f")
glue("coordinator_growth", traffic[4][0] / traffic[2][0], ".2f")
glue("ring_growth", traffic[4][1] / traffic[2][1], ".2f")

# %% jupyter={"source_hidden": true}
say("""
The measured numbers sit {glue}`bytes_above_least` to {glue}`bytes_above_most`
bytes above the formulas, and every byte of it is accounted for:

* the coordinator receives {glue}`coordinator_above_2` and
  {glue}`coordinator_above_4` bytes more at n = 2 and 4: each of the n - 1
  workers packs its number of examples as one more float32 (4 bytes) at the
  end of its gradient (the weighted average needs it);
* DDP all-reduces the example count, one 8-byte integer, in a call of its own
  before the first bucket's. So small a call goes *one-shot* (every rank
  sends it to each of the n - 1 others): {glue}`count_bytes_2` and
  {glue}`count_bytes_4` bytes, the lines "of the ring rank's bytes" above;
* the rest, {glue}`bucket_above_2` and {glue}`bucket_above_4` bytes above
  2 (n - 1) / n N, is the ring cutting a bucket whose number of floats is not
  a multiple of n into n chunks that differ by one float: the printed rank
  (the busiest) sends the larger ones.

Going from 2 to 4 workers, the
coordinator's load grows {glue}`coordinator_growth` times (the formulas:
(4 - 1) / (2 - 1) = 3) while the ring's grows {glue}`ring_growth` times
(the formulas: 1.5), toward its ceiling of 2 N. The picture below extends the
formulas to more workers than this machine can run.
""")

# %%
ns = np.arange(2, 33)
figure, axis = plt.subplots(figsize=(7, 4))
axis.plot(ns, (ns - 1) * N / 1e3, label="coordinator receives, (n-1) N")
axis.plot(ns, 2 * (ns - 1) / ns * N / 1e3, label="one ring rank sends, 2(n-1)/n N")
for n, (coordinator_in, ring_out) in traffic.items():
    axis.plot([n], [coordinator_in / 1e3], "o", color="C0")
    axis.plot([n], [ring_out / 1e3], "s", color="C1")
axis.set_xlabel("workers n")
axis.set_ylabel("kB per step")
axis.set_title("bytes per step on the busiest link (dots: measured from the trace)")
axis.grid(alpha=0.3)
axis.legend()
figure.tight_layout()
show_figure(figure, "dp_traffic.png")

# %% [markdown]
# ## 4. Overlap: all_reduce while backward still runs
#
# Backward produces gradients from the last layer to the first. DDP packs
# them into *buckets* of at most `bucket_cap_mb` megabytes (here 0.1 MiB,
# 104,857 bytes, so that this section's model, larger than section 3's, has
# several; the run prints each bucket's bytes) and starts a bucket's all_reduce as soon as the bucket is full,
# without waiting for the rest of backward. We wrap backward in
# `trace.region("backward")` and look at the timeline of one step.

# %%
def train_for_timeline(overlap):
    rank = dist.get_rank()
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    # Backward reaches the first layer last: mark the moment its gradients are
    # ready (hooked before DDP's own hooks, so the mark comes before DDP reacts).
    for parameter in model[0].parameters():
        parameter.register_post_accumulate_grad_hook(
            lambda tensor: trace.record("mark", trace.now(), trace.now(),
                                        label="last gradient ready"))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.1, overlap=overlap, algorithm="ring")
    optimizer = optim.SGD(ddp.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(3):
        xs = x_train[(2 * step + rank) * 64:(2 * step + rank + 1) * 64]
        ys = y_train[(2 * step + rank) * 64:(2 * step + rank + 1) * 64]
        with trace.region(f"step {step}", kind="step"):
            optimizer.zero_grad(set_to_none=False)
            with trace.region("forward"):
                loss = loss_fn(ddp(Tensor(xs)), ys)
            with trace.region("backward"):
                loss.backward()
            with trace.region("update"):
                optimizer.step()
    return [sum(p.data.nbytes for p in bucket) for bucket in ddp.buckets]


def last_step(events):
    """The events of the last traced step (the first ones include the start-up broadcast)."""
    begin = min(e["start"] for e in events if e["kind"] == "step" and e["label"] == "step 2")
    return [e for e in events if e["start"] >= begin]


def where_all_reduce_starts(events, rank=0):
    """Times (us) from the start of backward to the first all_reduce and to the
    moment the last gradient (the first layer's) was ready, on one rank."""
    backward = next(e for e in events if e["rank"] == rank and e["label"] == "backward")
    first_call = min(e["start"] for e in events if e["rank"] == rank
                     and e["kind"] == "collective"
                     and trace.label_info(e["label"]).get("collective") == "all_reduce")
    last_gradient = max(e["start"] for e in events if e["rank"] == rank and e["kind"] == "mark")
    # time this rank spent in its messages (sends, receives) before the last gradient was ready
    in_messages = sum(min(e["end"], last_gradient) - e["start"] for e in events
                      if e["rank"] == rank and e["kind"] in ("send", "recv")
                      and e["start"] < last_gradient)
    return ((first_call - backward["start"]) / 1e3, (last_gradient - backward["start"]) / 1e3,
            in_messages / 1e3)


overlap_runs = {}
for overlap in (True, False):
    path = OUT / f"ddp_overlap_{overlap}.trace.jsonl"
    bucket_bytes = minidist.launch(train_for_timeline, world_size=2, transport="shm",
                                   args=(overlap,), trace=str(path))[0]
    if overlap:
        print(f"this section's model: {sum(bucket_bytes):,} bytes of float32 parameters, in "
              f"{len(bucket_bytes)} buckets of at most {int(0.1 * 2**20):,} bytes: "
              + ", ".join(f"{b:,}" for b in bucket_bytes) + " bytes, last layer first")
    events = last_step(trace.read_jsonl(path).events)
    first_call, last_gradient, in_messages = where_all_reduce_starts(events)
    overlap_runs[overlap] = (first_call, last_gradient, in_messages)
    print(f"overlap={overlap!s:>5} ({len(bucket_bytes)} buckets), rank 0, from the start of backward: "
          f"first all_reduce at {first_call:6.0f} us, last gradient ready at "
          f"{last_gradient:6.0f} us -> all_reduce starts "
          f"{'before' if first_call < last_gradient else 'after'} backward has finished; "
          f"{in_messages:,.0f} us of it in messages before the last gradient")
    # the step's own span is left out of the picture: its grey row is the all_reduce calls'
    picture = save_timeline([e for e in events if e["kind"] != "step"], OUT / f"ddp_timeline_overlap_{overlap}.png",
                            title=f"one DDP step, 2 ranks, overlap={overlap}")
    show_file(picture)
    if overlap:
        forward = next(e for e in events if e["rank"] == 0 and e["label"] == "forward")
        glue("forward_us", (forward["end"] - forward["start"]) / 1e3, "{:,.0f} us")
        # the algorithm of rank 0's first all_reduce call, as the picture labels it
        first = min((e for e in events if e["rank"] == 0 and e["kind"] == "collective"
                     and trace.label_info(e["label"]).get("collective") == "all_reduce"),
                    key=lambda e: e["start"])
        glue("first_algorithm", trace.label_info(first["label"]).get("algorithm", "?"))

(on_first, on_last, on_messages), (off_first, off_last, _) = overlap_runs[True], overlap_runs[False]
glue("overlap_messages_us", on_messages, "{:,.0f} us")
glue("overlap_later_us", on_last - off_last, "{:,.0f} us")
glue("overlap_rest_verdict",
     "which is as much as the whole difference, or more: the messages alone account for it"
     if on_messages >= on_last - off_last else
     "and the rest of the difference is the machine (2 cores, shared by both ranks and "
     "whatever else runs), which is why the two runs' times differ from one run to the next")
glue("overlap_backward_verdict",
     "came later with overlap than without, by " + glued("overlap_later_us") if on_last > off_last
     else "came no later with overlap than without")
glue("overlap_first_us", on_first, "{:,.0f} us")
glue("overlap_last_us", on_last, "{:,.0f} us")
glue("no_overlap_first_us", off_first, "{:,.0f} us")
glue("no_overlap_last_us", off_last, "{:,.0f} us")
glue("overlap_verdict", "starts while backward is still computing the earlier layers"
     if on_first < on_last else
     "started only after the last gradient this time (the machine's scheduling reversed the "
     "order; run the cell again)")
glue("no_overlap_verdict", "waits until the last gradient, the first layer's, is ready"
     if off_first >= off_last else
     "started before the last gradient was marked, which should not happen: look at the "
     "picture")

# %% jupyter={"source_hidden": true}
say("""
With `overlap=True` the first all_reduce (the 8-byte example count, which the
picture labels {glue}`first_algorithm`, then the last layer's bucket)
{glue}`overlap_verdict`: it began {glue}`overlap_first_us` after the start of
backward, the last gradient was ready at {glue}`overlap_last_us`. With
`overlap=False` every all_reduce {glue}`no_overlap_verdict`
({glue}`no_overlap_first_us` against {glue}`no_overlap_last_us`). (In both
cases the all_reduces run inside `loss.backward()`: DDP finishes them from its
hook on the last gradient, so that `.grad` is ready when backward returns.
That is why the "backward" box in the pictures above also covers the
communication; the moment the last gradient was ready, printed above, comes
from a mark in the trace that the pictures do not draw.)

The last gradient {glue}`overlap_backward_verdict`. That is the price of
overlap on one core: with `overlap=True` the hooks send and receive between
the layers' gradients, on the same core that computes them, and backward
resumes only when they return. Rank 0 spent {glue}`overlap_messages_us` in
messages before its last gradient was ready, {glue}`overlap_rest_verdict`.

The two pictures above, `ddp_timeline_overlap_True.png` and
`ddp_timeline_overlap_False.png`, have one row per rank: the grey bars on top
are the all_reduce calls (the legend's "collective call"), the blue ones the
compute regions, and below them the messages sent and received. Time 0 is the
first event of the step on either rank, so the two ranks' rows need not start
together: a rank that reaches its all_reduce first waits in it for the other.
Each row's compute starts with the forward pass, {glue}`forward_us` on rank 0
with overlap: a sliver at the left of the blue bar, so thin at this scale that
the first all_reduce seems to start with the step.
""")

# %% [markdown]
# What 2 cores cannot show: a speed-up from overlap. Here nothing runs in
# the background. The all_reduce only moves forward when backward hands
# over the next gradient (`Work.test()`), and the copying is done by the
# same CPU core that computes. On a GPU cluster the network card and a
# separate stream move the data while the GPU computes, and overlap hides
# most of the communication time. What the trace shows is the *order* of
# events, which is the part that does not depend on the hardware.

# %% [markdown]
# ## 5. Stragglers: everyone waits for the slowest
#
# A synchronous step cannot finish before every worker has sent its
# gradient. If one worker is c times slower (c, the slowdown factor: a
# busier machine, a slower card, a bigger shard), every worker's step takes
# as long as that one's.
#
# To show it without needing c times more cores, the library's `Straggler`
# (`minidist/parallel/parameter_server/straggler.py`) times a rank's compute and, on the
# ranks it is told are slow, sleeps c - 1 times as long again: in each step,
# the compute region of a c times slower rank lasts c times as long as its
# own body took in that step. Sleeping uses no
# CPU, so 2 cores are enough for this experiment. To make the compute long
# enough to measure, we pretend a step's compute takes 20 ms (`time.sleep`)
# on top of the real forward pass.
#
# DDP all-reduces inside `loss.backward()`, so the straggler wraps what
# comes before it, the forward pass: rank 1's gradients then leave late, and
# rank 0 waits for them in the all_reduce.

# %%
COMPUTE = 0.02
STRAGGLER_STEPS = 4 if QUICK else 10


def straggler_run(c):
    rank = dist.get_rank()
    model = make_model(seed=0)
    ddp = DistributedDataParallel(model)
    optimizer = optim.SGD(ddp.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    straggler = Straggler({1: c})                  # rank 1 is c times slower
    steps, computes = [], []
    for step in range(STRAGGLER_STEPS):
        begin = time.perf_counter()
        xs = x_train[(2 * step + rank) * 32:(2 * step + rank + 1) * 32]
        ys = y_train[(2 * step + rank) * 32:(2 * step + rank + 1) * 32]
        with trace.region(f"step {step}", kind="step"):
            optimizer.zero_grad(set_to_none=False)
            with straggler.compute("forward"):
                time.sleep(COMPUTE)                # the pretend compute, the same everywhere
                loss = loss_fn(ddp(Tensor(xs)), ys)
            computes.append(time.perf_counter() - begin)
            loss.backward()                        # all_reduce happens in here
            optimizer.step()
        steps.append(time.perf_counter() - begin)
    return float(np.median(computes)), float(np.median(steps))


slowdowns = [1, 2, 4]
straggler = {}
region_ratio = {}
for k in slowdowns:
    path = OUT / f"straggler{k}.trace.jsonl"
    straggler[k] = minidist.launch(straggler_run, world_size=2, transport="shm", args=(k,),
                                   trace=str(path))
    (c0, s0), (c1, s1) = straggler[k]
    print(f"rank 1 {k}x slower: rank 0 computes {c0 * 1e3:5.1f} ms, step {s0 * 1e3:5.1f} ms | "
          f"rank 1 computes {c1 * 1e3:5.1f} ms, step {s1 * 1e3:5.1f} ms")
    # from the trace: rank 1's body and its added wait, step by step
    waits = [e for e in trace.read_jsonl(path).events
             if trace.label_text(e["label"]) == "straggler wait"]
    if waits:
        region_ratio[k] = float(np.median([
            (trace.label_info(e["label"])["compute_ns"] + e["end"] - e["start"])
            / trace.label_info(e["label"])["compute_ns"] for e in waits]))
        print(f"    rank 1's forward + straggler wait, in the trace: {region_ratio[k]:.2f} times "
              f"its forward of the same step (median over the steps)")

figure, axis = plt.subplots(figsize=(7, 4))
width = 0.35
positions = np.arange(len(slowdowns))
for rank in range(2):
    axis.bar(positions + (rank - 0.5) * width, [straggler[k][rank][1] * 1e3 for k in slowdowns],
             width, label=f"rank {rank}: step", color=f"C{rank}")
    axis.bar(positions + (rank - 0.5) * width, [straggler[k][rank][0] * 1e3 for k in slowdowns],
             width, color="none", edgecolor="black", hatch="//",
             label="own compute" if rank == 0 else None)
axis.set_xticks(positions)
axis.set_xticklabels([f"rank 1 {k}x slower" for k in slowdowns])
axis.set_ylabel("median step time (ms)")
axis.set_title("a synchronous step lasts as long as the slowest worker")
axis.legend()
figure.tight_layout()
show_figure(figure, "stragglers.png")

rank0_computes = [straggler[k][0][0] for k in slowdowns]
glue("rank0_compute_least", min(rank0_computes) * 1e3, "{:.1f} ms")
glue("rank0_compute_most", max(rank0_computes) * 1e3, "{:.1f} ms")
glue("rank0_step_1", straggler[1][0][1] * 1e3, "{:.1f} ms")
glue("rank0_step_2", straggler[2][0][1] * 1e3, "{:.1f} ms")
glue("rank0_step_4", straggler[4][0][1] * 1e3, "{:.1f} ms")
glue("rank1_compute_1", straggler[1][1][0] * 1e3, "{:.1f} ms")
glue("rank1_compute_2", straggler[2][1][0] * 1e3, "{:.1f} ms")
glue("rank1_compute_4", straggler[4][1][0] * 1e3, "{:.1f} ms")
follows = all(straggler[k][0][1] >= straggler[k][1][0] for k in slowdowns)
extras = [round(straggler[k][0][1] * 1e3, 1) - round(straggler[k][1][0] * 1e3, 1)
          for k in slowdowns]
glue("rank0_extra_least", min(extras), "{:.1f} ms")
glue("rank0_extra_most", max(extras), "{:.1f} ms")
glue("region_ratio_2", region_ratio[2], ".2f")
glue("region_ratio_4", region_ratio[4], ".2f")
glue("rank1_growth_2", round(straggler[2][1][0] * 1e3, 1) / round(straggler[1][1][0] * 1e3, 1),
     ".1f")
glue("rank1_growth_4", round(straggler[4][1][0] * 1e3, 1) / round(straggler[1][1][0] * 1e3, 1),
     ".1f")
glue("rank0_step_verdict", "lasts as long as rank 1's compute plus " + glued("rank0_extra_least")
     + " to " + glued("rank0_extra_most") + " (rank 0's backward, all_reduce and update, "
     "after it has waited)"
     if follows else "lasted less than rank 1's compute in at least one run here (a median of "
     "few steps on a busy machine; the picture shows each run)")

# %% jupyter={"source_hidden": true}
say("""
Rank 0's own compute, 20 ms of pretend work and a real forward pass, took
{glue}`rank0_compute_least` to {glue}`rank0_compute_most` whatever c, yet its
step grows with c: {glue}`rank0_step_1`,
{glue}`rank0_step_2` and {glue}`rank0_step_4` for c = 1, 2 and 4. It
{glue}`rank0_step_verdict`; rank 1 computed {glue}`rank1_compute_1`,
{glue}`rank1_compute_2` and {glue}`rank1_compute_4`. Rank 0 spends the
difference waiting inside the all_reduce for rank 1's gradient.

Rank 1's compute grew {glue}`rank1_growth_2` and {glue}`rank1_growth_4` times,
not exactly 2 and 4: the straggler multiplies each step's *own* body, and by at
least c (in the trace, forward plus wait is {glue}`region_ratio_2` and
{glue}`region_ratio_4` times that step's forward: a sleep can only overshoot),
and the body, a 20 ms sleep and a forward pass,
itself took longer in those runs: a sleep on a busy machine overshoots, and
the measured compute also holds the step's `zero_grad`. The timeline
of the 4x run below shows where: on rank 1, the compute region "forward" is
followed by "straggler wait", three times as long (the picture draws both in
blue, end to end, so they look like one bar: the forward is its first quarter);
on rank 0, the all_reduce
call stretches over the same time, idle.
""")

# %%
events = trace.read_jsonl(OUT / "straggler4.trace.jsonl").events
last = min(e["start"] for e in events if e["label"] == f"step {STRAGGLER_STEPS - 1}")
picture = save_timeline([e for e in events if e["start"] >= last and e["kind"] != "step"],
                        OUT / "straggler_timeline.png",
                        title="one DDP step, rank 1 four times slower")
show_file(picture)
waits = [e for e in events if trace.label_text(e["label"]) == "straggler wait"]
print(f"'straggler wait' regions: rank(s) {sorted({e['rank'] for e in waits})}, "
      f"factor {trace.label_info(waits[0]['label'])['factor']}")

# %% [markdown]
# With n workers, each step costs the *maximum* of n compute
# times, so the more workers, the more likely one of them is slow at any
# moment. The same holds for the coordinator: it cannot average before the
# last gradient arrives.
#
# Remedies, in short: give slower workers smaller shards (the library
# weights by example count, so uneven shards stay exact); drop or replace
# chronically slow machines; or give up strict synchronisation
# (asynchronous or bounded-staleness updates, at the cost of training on
# slightly old weights).
#
# Try: in section 2's code cell, change the constant `WORLD = 2` (the number
# of workers) to 4 (the processes will take turns on
# 2 cores, so expect it to be slower, but the weights still match), or pass
# `overlap=False` to `DistributedDataParallel` in section 2 and check that
# the weights do not change.

# %% [markdown]
# ## The same script on a cluster
#
# Everything above ran on this machine: `minidist.launch` forked the
# workers and they talked through shared memory. A cluster is machines
# with private memories joined by a network, and the engine clusters use
# to start programs and move their messages is MPI. This lesson runs there
# unchanged:
#
# ```bash
# # mpi4py and MPICH (or your cluster's own MPI):
# pip install -e '.[mpi]'
# mpiexec -n 2 python lessons/05_data_parallel.py
# # MPICH, 8 ranks on the cores of the machines listed in hosts:
# mpiexec -f hosts -n 8 python lessons/05_data_parallel.py
# ```
#
# with `hosts` listing one machine per line (`node1:4`, `node2:4`: a host
# and how many ranks it takes; Open MPI spells it `--hostfile hosts` with
# `node1 slots=4`). Under mpiexec every process runs the whole script, as
# every MPI program does; each `minidist.launch(fn, world_size=2)` then runs
# `fn` on the job's first 2 ranks over the **mpi transport** (point-to-point
# MPI messages: the ring, the trees and DDP's buckets are the same code), and
# hands every rank the list of results, so the plotting after it works
# everywhere. A launch that asks for more ranks than mpiexec started runs on
# rank 0's machine, and says so. A script that calls
# `dist.init_process_group()` itself (examples/hello.py) joins the job the
# same way, and `minidist run --transport mpi -n 4 script.py` calls mpiexec
# for you. To time the course's ring against MPI's own:
# `dist.all_reduce(grad, algorithm="native")` calls MPI_Allreduce
# (`benchmarks/bench_mpi.py` compares them).

# %% [markdown]
# ## Your turn
#
# Two exercises on this chapter, checked on real processes:
# `minidist exercise start coordinator_data_parallel` (one coordinator step
# with uneven shards) and `minidist exercise start ddp_bucketing` (one
# all_reduce per bucket; the checker counts your calls). Check each with
# `minidist exercise check NAME`.
