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
# # Lesson 7: the parameter server
#
# Lesson 5's coordinator did two jobs: it collected the gradients and it held
# the weights. A **parameter server** (PS) makes that second job a role of
# its own. The LSML lecture's slide ("Распараллеливание нейросетей", Large
# Scale Machine Learning, lecture 7), on linear regression:
#
# 1. every worker reads its own part of the data and computes a gradient g;
# 2. it **pushes** g to the parameter server;
# 3. the server updates its weights w from the pushes it receives;
# 4. the worker **pulls** the updated w and goes on.
#
# Two promises come with this scheme: the server can be *several* machines,
# each owning a slice of the parameters (sharding), and the server can relax
# *consistency*, letting workers go on without waiting for each other
# (lesson 8). This chapter stays synchronous (BSP, "bulk synchronous
# parallel"):
#
# 1. the LSML lecture's example, linear regression with known true weights, and
#    the push/pull picture drawn from a real trace;
# 2. BSP is exactly full-batch SGD, checked to the last bits;
# 3. sharding: who owns which keys, and what each server receives;
# 4. the server's bandwidth bottleneck: bytes at the server against bytes
#    of one rank of a ring all_reduce, measured and against the formulas;
# 5. the MLP on the digits through a sharded PS;
# 6. how long BSP workers sit idle, read from the trace.
#
# The library code is `minidist/parallel/parameter_server/server.py`, with
# the roles and key ranges in `layout.py`, the messages in `messages.py` and
# the consistency modes in `shard.py` beside it (the examples below:
# `minidist/examples/parameter_server.py`); their docstrings say the same
# things in more detail.

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.data import load_digits, make_linear_regression
from minidist.examples.parameter_server import (
    digits_accuracy,
    digits_mlp,
    linear_regression_gradient,
    split_rows,
    train_linear_regression,
    train_mlp_on_digits,
)
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
from minidist.lesson_timing import Load
from minidist.parallel.parameter_server.layout import (
    flat_parameters,
    load_flat_parameters,
    shard_ranges,
)

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

from viz.lesson_figures import draw_ps_bandwidth  # noqa: E402

QUICK = quick()
OUT = output_dir()

# %% jupyter={"source_hidden": true}
if QUICK:
    say("""
*This is the quick form of the lesson.* It counts the traffic over 6 steps in
section 4 (the full form: 30), trains the digits MLP for 60 steps in section 5
(the full form: 300, so its accuracy there is lower) and times 10 BSP steps
in section 6 (the full form: 40); sections 1 to 3 are the same.
""")


def info(event):
    return trace.label_info(event["label"])


def paired_messages(events):
    """(send, recv) pairs: the send (rank=a, peer=b, seq=s) and the recv
    (rank=b, peer=a, seq=s) are the two ends of one message."""
    receives = {(e["rank"], e["peer"], e["seq"]): e for e in events if e["kind"] == "recv"}
    return [(e, receives[(e["peer"], e["rank"], e["seq"])]) for e in events
            if e["kind"] == "send" and (e["peer"], e["rank"], e["seq"]) in receives]


# %% [markdown]
# ## 1. The LSML lecture's example: linear regression
#
# `make_linear_regression` draws `x`, true weights `w*` and a true bias
# `b*`, and sets `y = x w* + b* + noise`. Three workers each hold a third of
# the 200 rows; one server holds `w` (8 weights and the bias), starting from
# zeros. Every step, each worker computes the gradient of the mean squared
# error on its rows and pushes it; the server averages the three pushes and
# takes one SGD step; the workers pull the new weights.
#
# `train_linear_regression` is that program. It runs on every rank of the
# launch: rank 0 becomes the server, ranks 1..3 the workers. The workers
# are also numbered among themselves, 0, 1, 2: with S servers on ranks
# 0 .. S - 1, worker k is rank S + k (here rank k + 1). The lesson says
# "worker" with the worker's own number, and "rank" with the launch's.

# %%
LINEAR_STEPS = 60
x_all, y_all, true_weights, true_bias = make_linear_regression(200, 8, 0.1, 0, np.float64)
path = OUT / "ps_linear.trace.jsonl"
results = minidist.launch(train_linear_regression, world_size=4, args=(LINEAR_STEPS,),
                          kwargs=dict(servers=1, mode="bsp", lr=0.1), trace=str(path))
learnt = results[0].weights
truth = np.append(true_weights, true_bias)
least_squares = np.linalg.lstsq(np.column_stack([x_all, np.ones(len(x_all))]), y_all,
                                rcond=None)[0]
print("true weights and bias:", np.round(truth, 3))
print("learnt by the PS     :", np.round(learnt, 3))
print("least squares        :", np.round(least_squares, 3))
print(f"largest difference from the truth: PS {np.abs(learnt - truth).max():.3f}, "
      f"least squares {np.abs(least_squares - truth).max():.3f} (noise 0.1 on 200 rows)")
glue("ps_error", np.abs(learnt - truth).max(), ".3f")
glue("linear_steps", LINEAR_STEPS, "d")
glue("lstsq_error", np.abs(least_squares - truth).max(), ".3f")
glue("ps_from_lstsq", np.abs(learnt - least_squares).max(), ".3f")
glue("linear_verdict", "come back to within the noise" if np.abs(learnt - truth).max() < 0.1
     else "have not come back to within the noise yet")

# %% jupyter={"source_hidden": true}
say("""
The weights {glue}`linear_verdict`: the largest difference from the true ones is
{glue}`ps_error`, against {glue}`lstsq_error` for the exact least-squares fit of
the same 200 noisy rows, the best any method can do with them (the PS ends
{glue}`ps_from_lstsq` from that fit after its {glue}`linear_steps` steps).
""")

# %% [markdown]
# Now the picture: every message
# of the run is in the trace, labelled `kind=push` (worker to server, the
# gradient), or `kind=pull` (the request and the server's answer with the
# weights). We draw steps 1 and 2 (step 0 is mixed up with the processes
# starting): time goes right, one row per rank, an arrow per message, boxes
# for the workers' gradient computations and the server's update.

# %%
def draw_push_pull(events, steps, file, title):
    """Rows: ranks (server on top); arrows: messages; boxes: compute regions.
    Shows the BSP steps ``steps`` (a range), from the end of the update before them,
    saved as ``file`` in the lesson's folder and shown."""
    updates = {info(e)["step"]: e for e in events
               if e["kind"] == "compute" and info(e).get("kind") == "update"}
    t0 = updates[steps[0] - 1]["end"] if steps[0] > 0 else min(e["start"] for e in events)
    last = updates[steps[-1]]["end"]
    ms = lambda ns: (ns - t0) / 1e6  # noqa: E731
    inside = lambda e: e["start"] >= t0 and e["end"] <= last  # noqa: E731
    ranks = sorted({e["rank"] for e in events})
    figure, axis = plt.subplots(figsize=(10, 3.6))
    colours = {"push": "C3", "pull": "C0"}
    for send, recv in paired_messages(events):
        what = info(send).get("kind")
        if what not in colours or send["start"] < t0 or send["start"] > last:
            continue
        header = send["bytes"] <= 40   # a request, or a reply's version number
        axis.annotate("", xy=(ms(recv["end"]), recv["rank"]),
                      xytext=(ms(send["start"]), send["rank"]),
                      arrowprops=dict(arrowstyle="->", color=colours[what],
                                      lw=0.6 if header else 1.6, alpha=0.5 if header else 1))
    for e in events:
        if e["kind"] == "compute" and inside(e):
            kind = "update" if info(e).get("kind") == "update" else "gradient"
            axis.barh(e["rank"], ms(e["end"]) - ms(e["start"]), left=ms(e["start"]),
                      height=0.3, color="C2" if kind == "gradient" else "C1")
    axis.set_yticks(ranks)
    axis.set_yticklabels(["server" if r == 0 else f"worker {r - 1}" for r in ranks])
    axis.invert_yaxis()
    axis.set_xlim(0, ms(last) * 1.05)
    axis.set_xlabel(f"ms since the end of step {steps[0] - 1}'s update")
    handles = [plt.Line2D([], [], color="C3", lw=1.6, label="2. push (gradient)"),
               plt.Line2D([], [], color="C0", lw=1.6, label="4. pull (weights)"),
               plt.Rectangle((0, 0), 1, 1, color="C2", label="1. gradient"),
               plt.Rectangle((0, 0), 1, 1, color="C1", label="3. update")]
    axis.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    axis.set_title(title)
    figure.tight_layout()
    show_figure(figure, file)


events = trace.read_jsonl(path).events
draw_push_pull(events, range(1, 3), "ps_push_pull.png",
               "BSP steps 1 and 2 of linear regression, from the trace")

# %% [markdown]
# In the picture above (`ps_push_pull.png`) the four steps of the LSML slide follow each other: each
# worker computes (green), pushes (red arrows into the server's row); the
# server's update (orange) starts only after the *last* push of the step has
# arrived; then the server answers the waiting pulls (blue). Thin arrows are
# the small headers (a request says which step it pushes and which it wants
# to pull; a reply carries the version of the weights). A worker's push and
# its request for the next weights travel together, so after pushing it
# just waits for the blue arrow.
#
# ## 2. BSP is full-batch SGD
#
# The server averages the pushes weighted by each worker's number of
# examples. The average of the gradients of the mean loss over each worker's
# rows, weighted so, is the gradient of the mean loss over all rows. So BSP
# with n workers takes exactly the steps of one process doing gradient
# descent on the whole data set. We check it, with 3 workers and with the
# weights split over 1 and over 2 servers (200 rows over 3 workers: shards
# of 67, 67 and 66, uneven on purpose).

# %%
def full_batch_gradient_descent(steps, lr):
    weights = np.zeros(9)
    for _ in range(steps):
        gradient, _, _ = linear_regression_gradient(weights, x_all, y_all)
        weights -= lr * gradient
    return weights


single = full_batch_gradient_descent(LINEAR_STEPS, 0.1)
by_servers = {}
for servers in (1, 2):
    results = minidist.launch(train_linear_regression, world_size=3 + servers,
                              args=(LINEAR_STEPS,), kwargs=dict(servers=servers, lr=0.1))
    by_servers[servers] = results[0].weights
    print(f"{servers} server{'s' if servers > 1 else ''}, 3 workers: max |w_PS - w_single| = "
          f"{np.abs(by_servers[servers] - single).max():.1e}")
print("1 server and 2 servers give identical bits:", np.array_equal(by_servers[1], by_servers[2]))
bsp_gap = max(np.abs(weights - single).max() for weights in by_servers.values())
glue("bsp_gap", bsp_gap, ".1e")
glue("bsp_verdict", "There is no difference to the single process at all (largest "
     f"difference {glued('bsp_gap')}), not even in the last bits, though rounding could have "
     "made one: the sum over rows is taken in another order" if bsp_gap == 0 else
     f"The difference to the single process is rounding only (largest difference "
     f"{glued('bsp_gap')}): the sum over rows is taken in another order" if bsp_gap < 1e-9 else
     f"The PS and the single process differ by {glued('bsp_gap')}, more than rounding")
glue("shard_verdict", "Sharding changes nothing at all" if np.array_equal(
    by_servers[1], by_servers[2]) else "Sharding changed the last bits")

# %% jupyter={"source_hidden": true}
say("""
{glue}`bsp_verdict`. {glue}`shard_verdict`: each server runs the same arithmetic
on its own keys.
""")

# %% [markdown]
# ## 3. Sharding: key ranges
#
# The parameters are one flat vector of Ψ numbers (Ψ, the parameters'
# count, as in lessons/NOTATION.md; `P` in the code). With S servers, each
# server owns one contiguous key range: `shard_ranges(P, S)`, as even as
# possible.
# A worker pushes each server only its slice of the gradient, and pulls
# each slice from its owner. For the digits' MLP (64 -> 32 -> 10), the
# ranges cut straight through the layers: a server does not care what its
# keys mean.

# %%
mlp = digits_mlp()
P = flat_parameters(mlp).size
layer_bounds = np.cumsum([0] + [p.data.size for p in mlp.parameters()])
names = ["layer 1 weights", "layer 1 bias", "layer 2 weights", "layer 2 bias"]
print(f"MLP: Ψ = {P} parameters, layers at keys "
      + ", ".join(f"{name} {a}:{b}" for name, a, b in zip(names, layer_bounds[:-1],
                                                          layer_bounds[1:])))
for servers in (1, 2, 3):
    print(f"S = {servers}: " + ", ".join(f"server {s} keys {a}:{b} ({b - a})"
                                         for s, (a, b) in enumerate(shard_ranges(P, servers))))

# %% [markdown]
# ## 4. The server's bandwidth bottleneck
#
# Per step, with N the gradient's bytes (4Ψ for Ψ float32 parameters: the
# message a worker pushes, and the weights it pulls) and n workers:
#
# * a single server **receives** a gradient from every worker, n N, and
#   **sends** the weights to every worker, n N more; each worker sends N and
#   receives N. The server's link carries n times what a worker's does;
# * with S servers, each one carries n N / S (each way);
# * in a ring all_reduce of the same gradient among the n workers, with no
#   server at all, every rank sends 2 (n - 1) / n N and receives as much:
#   under 2 N whatever n is.
#
# We measure it: the same MLP, the same batches, the same number of steps,
# trained by a PS (1 server with n = 2, 3, 4 workers; 2 servers with
# n = 3) and by n ranks that all-reduce their gradient (ring) and each take
# the step themselves. From each trace we count the bytes the busiest rank
# receives and sends during training, and divide by the steps and by the
# time training took.

# %%
x_train, y_train, x_test, y_test = load_digits()
TRAFFIC_STEPS = 6 if QUICK else 30
BATCH = 32


def batch_of(rows, step):
    """The worker's next BATCH rows of its part, cycling (as train_mlp_on_digits)."""
    mine = np.arange(rows.start, rows.stop)
    return mine[np.arange(step * BATCH, (step + 1) * BATCH) % len(mine)]


def ring_training(steps, lr=0.1):
    """Data parallel without a server: all_reduce(AVG) the flat gradient (ring)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = digits_mlp()
    weights = flat_parameters(model)
    rows = split_rows(len(y_train), world)[rank]
    for step in range(steps):
        batch = batch_of(rows, step)
        load_flat_parameters(model, weights)
        model.zero_grad()
        nn.functional.cross_entropy(model(Tensor(x_train[batch])), y_train[batch]).backward()
        gradient = np.concatenate([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(gradient, op=dist.ReduceOp.AVG, algorithm="ring")
        weights -= lr * gradient
    return weights


def training_traffic(events, rank, during, steady):
    """Bytes rank ``rank`` received and sent during training (messages whose
    label passes ``during``), and its bytes per second from ``steady`` on
    (after the first step, which also waits for the processes to start)."""
    mine = [e for e in events if e["rank"] == rank and e["kind"] in ("send", "recv")
            and during(e)]
    received = sum(e["bytes"] for e in mine if e["kind"] == "recv")
    sent = sum(e["bytes"] for e in mine if e["kind"] == "send")
    later = [e for e in mine if e["start"] >= steady]
    seconds = (max(e["end"] for e in later) - min(e["start"] for e in later)) / 1e9
    return received, sent, sum(e["bytes"] for e in later) / seconds


def not_final_broadcast(e):
    return info(e).get("call") is None       # the PS ends by broadcasting the weights


def part_of_all_reduce(e):
    return e["label"].startswith("all_reduce")


def end_of_first_update(events, rank=0):
    return min(e["end"] for e in events if e["rank"] == rank and e["kind"] == "compute"
               and info(e).get("kind") == "update")


def end_of_first_all_reduce(events, rank):
    return min(e["end"] for e in events if e["rank"] == rank and e["kind"] == "collective")


P_BYTES = P * 4   # float32: N, the gradient's bytes
print(f"Ψ = {P} float32 parameters: N = {P_BYTES} bytes; {TRAFFIC_STEPS} steps, batches of {BATCH}")
traffic = []
load = Load.start()
for workers, servers in ((2, 1), (3, 1), (4, 1), (3, 2)):
    path = OUT / f"ps_traffic_{workers}w_{servers}s.trace.jsonl"
    minidist.launch(train_mlp_on_digits, world_size=workers + servers, args=(TRAFFIC_STEPS,),
                    kwargs=dict(servers=servers), trace=str(path))
    events = trace.read_jsonl(path).events
    received, sent, rate = training_traffic(events, 0, not_final_broadcast,
                                            end_of_first_update(events))
    traffic.append(("PS server", workers, servers, received, sent, rate,
                    workers * P_BYTES / servers))
for workers in (2, 3, 4):
    path = OUT / f"ring_traffic_{workers}.trace.jsonl"
    minidist.launch(ring_training, world_size=workers, args=(TRAFFIC_STEPS,), trace=str(path))
    events = trace.read_jsonl(path).events
    busiest = max((training_traffic(events, r, part_of_all_reduce,
                                    end_of_first_all_reduce(events, r))
                   for r in range(workers)),
                  key=lambda t: t[0] + t[1])
    traffic.append(("ring rank", workers, 0, *busiest, 2 * (workers - 1) / workers * P_BYTES))
load = load.finish()

print(f"{'':>10} {'n':>2} {'S':>2} | {'recv B/step':>11} {'sent B/step':>11} {'formula':>9} "
      f"| {'MB/s after step 0':>17}")
for who, workers, servers, received, sent, rate, formula in traffic:
    print(f"{who:>10} {workers:>2} {servers or '-':>2} | {received / TRAFFIC_STEPS:11,.0f} "
          f"{sent / TRAFFIC_STEPS:11,.0f} {formula:9,.0f} | {rate / 1e6:17.2f}")

# %%
# What the text below says of the table, chosen from its numbers.
servers_row = {t[1]: t for t in traffic if t[0] == "PS server" and t[2] == 1}
rings = {t[1]: t for t in traffic if t[0] == "ring rank"}
sharded = next(t for t in traffic if t[0] == "PS server" and t[2] == 2)
per_push = [(t[3] / TRAFFIC_STEPS - t[6]) / t[1] for t in servers_row.values()]
per_pull = [(t[4] / TRAFFIC_STEPS - t[6]) / t[1] for t in servers_row.values()]


def between(values):
    """The format of a [least, most] pair: "47" when they round alike, else "41 to 47"."""
    return ("{0[0]:.0f}" if f"{min(values):.0f}" == f"{max(values):.0f}"
            else "{0[0]:.0f} to {0[1]:.0f}")


glue("push_extra", [min(per_push), max(per_push)], between(per_push))
glue("pull_extra", [min(per_pull), max(per_pull)], between(per_pull))
glue("columns_verdict", "higher than" if all(t[3] > t[4] for t in servers_row.values())
     else "lower than" if all(t[3] < t[4] for t in servers_row.values()) else "about")
glue("sharded_share", sharded[3] / servers_row[3][3], ".2f")
glue("server_growth", servers_row[4][3] / servers_row[2][3], ".2f")
glue("ring_2_over_n", rings[2][3] / P_BYTES / TRAFFIC_STEPS, ".2f")
glue("ring_4_over_n", rings[4][3] / P_BYTES / TRAFFIC_STEPS, ".2f")
server_rates = [round(servers_row[w][5] / 1e6, 1) for w in (2, 3, 4)]   # as printed
glue("server_rates", server_rates, "{0[0]:.1f}, {0[1]:.1f}, {0[2]:.1f}")
rate_growth = server_rates[-1] / server_rates[0]
glue("rate_growth", rate_growth, ".2f")
glue("rate_verdict",
     "hardly changes with n (less than 10 % from n = 2 to 4)" if abs(rate_growth - 1) < 0.1
     else "grows " + glued("rate_growth") + " times from n = 2 to 4, while the bytes per step "
     "grow " + glued("server_growth") + " times" if rate_growth > 1
     else "falls from n = 2 to 4 (to " + glued("rate_growth") + " times), while the bytes per "
     "step grow " + glued("server_growth") + " times")
server4 = servers_row[4][5]
ring4 = rings[4][5]
bytes_ratio = (4 * P_BYTES) / (2 * 3 / 4 * P_BYTES)
glue("bytes_ratio", bytes_ratio, ".1f")
glue("rate_ratio", server4 / ring4, ".1f")
print(f"n = 4: a server step carries {bytes_ratio:.1f} times a ring rank's bytes; this machine "
      f"moved {server4 / ring4:.1f} times a ring rank's bytes per second there")
if load.busy:
    print(load.note("the rates above measure the scheduler; the byte counts do not change"))

# %% jupyter={"source_hidden": true}
say("""
Per step the counts sit on the formulas: n N into one server plus
{glue}`push_extra` bytes per push (a 40-byte
request header travels with each, and every worker sends one request more, at
the start), n N / S into each of S servers (with 2
servers and n = 3, {glue}`sharded_share` of what one server received), and
2 (n - 1) / n N per ring rank. The servers' *received* column is
{glue}`columns_verdict` their *sent* one: a reply with the weights carries a
smaller header, {glue}`pull_extra` bytes per pull. Going from 2 to 4 workers, the single server's load grows
{glue}`server_growth` times (the formula: it doubles), the ring's from
{glue}`ring_2_over_n` N to {glue}`ring_4_over_n` N, toward its ceiling of 2 N.

The megabytes per second are what *this* machine managed, measured after the
first step, and they say little about n: with 3 to 5 processes on 2 shared
cores a step's time is set by Python and by processes taking turns on the
cores, not by a link. At the single server the rate was {glue}`server_rates`
MB/s for n = 2, 3, 4: it {glue}`rate_verdict` (and a busy machine moves it from
run to run). At n = 4 a server's step carries {glue}`bytes_ratio` times a ring
rank's bytes, and this machine moved {glue}`rate_ratio` times a ring rank's
bytes per second there. The bytes are what the formulas are about. On a real
cluster every link has about the same bandwidth, 1/β bytes per second, so a
step cannot be faster than the busiest link's bytes times β: the server's, n
times a worker's. The left picture below extends the byte formulas to 64
workers, with the measured points in their place; the right one turns them
into that least time per step on links of 10 GB/s.
""")

# %%
show_file(draw_ps_bandwidth(traffic, P_BYTES, TRAFFIC_STEPS, OUT / "ps_bandwidth.png"))

# %% [markdown]
# This is the second reason the LSML lecture gives for sharding ("the PS may be
# many machines"), after memory: with S = n servers, each of them receives
# N per step, like a worker. It is also why data-parallel training on GPUs
# moved from parameter servers to all_reduce: no rank is special, and the
# load per rank does not grow with n.
#
# ## 5. The MLP on the digits
#
# `train_mlp_on_digits` trains the MLP by PS: worker k (numbered among the
# workers, from 0) holds the k-th part
# of the training images and uses its next 32 of them each step. With
# 3 workers a BSP step uses 96 images. Here with 2 servers, and momentum
# 0.9 (each server keeps the momentum of its own keys).

# %%
MLP_STEPS = 60 if QUICK else 300
begin = time.perf_counter()
results = minidist.launch(train_mlp_on_digits, world_size=5, args=(MLP_STEPS,),
                          kwargs=dict(servers=2, mode="bsp", lr=0.1, momentum=0.9))
seconds = time.perf_counter() - begin
print(f"BSP, 2 servers, 3 workers, {MLP_STEPS} steps ({seconds:.1f} s with start-up): "
      f"test accuracy {digits_accuracy(results[0].weights):.3f}")
print("server key ranges:", [r.key_range for r in results[:2]],
      "versions:", [r.version for r in results[:2]])

losses = np.array([[loss for _, _, loss in r.losses] for r in results[2:]])
figure, axis = plt.subplots(figsize=(7, 3.5))
for k, row in enumerate(losses):
    axis.plot(row, lw=0.8, alpha=0.6, label=f"worker {k}: loss on its batch")
axis.plot(losses.mean(axis=0), color="black", label="mean of the three")
axis.set_xlabel("step")
axis.set_ylabel("cross-entropy")
axis.set_title("MLP on the digits, BSP parameter server (2 servers, 3 workers)")
axis.legend(fontsize=8)
axis.grid(alpha=0.3)
figure.tight_layout()
show_figure(figure, "ps_mlp_loss.png")

versions = [r.version for r in results[:2]]
mean_loss = losses.mean(axis=0)
tenth = max(1, len(mean_loss) // 10)
glue("mlp_steps", MLP_STEPS, "d")
glue("versions", " and ".join(str(v) for v in versions))
glue("versions_verdict", "one update per step" if all(v == MLP_STEPS for v in versions)
     else "not one update per step")
glue("loss_first", mean_loss[:tenth].mean(), ".2f")
glue("loss_last", mean_loss[-tenth:].mean(), ".2f")
glue("loss_verdict", "falls" if mean_loss[-tenth:].mean() < mean_loss[:tenth].mean()
     else "does not fall")

# %% jupyter={"source_hidden": true}
say("""
The servers end at versions {glue}`versions` after {glue}`mlp_steps` steps:
{glue}`versions_verdict`. The workers' losses are those of their own batch on the
weights they pulled, so they are noisy; their mean {glue}`loss_verdict`, from
{glue}`loss_first` over the first tenth of the steps to {glue}`loss_last` over
the last, as in lesson 5's data-parallel training.
""")

# %% [markdown]

# ## 6. Idle BSP workers
#
# In BSP a worker's pull for step i + 1 (i, a step's number) is answered
# only once the server has every push of step i. The wait shows up in the trace as a long `recv`
# of the pull reply. We compare, for every worker, the time spent in its
# gradient computations with the time spent waiting for pulls, first as is,
# then with worker 2 (rank 3, with the one server on rank 0) made a
# straggler (`straggler=(2, 0.02)`, a worker's number and seconds: it sleeps
# 20 ms before each gradient, as if its machine were slower).

# %%
IDLE_STEPS = 10 if QUICK else 40


def worker_time_split(events, rank):
    """Seconds in gradient regions and in pull receives on one worker rank,
    and the worker's whole span, from its first gradient on (the first pull
    also waits for the processes to start)."""
    begin = min(e["start"] for e in events if e["rank"] == rank and e["kind"] == "compute")
    mine = [e for e in events if e["rank"] == rank and e["start"] >= begin
            and info(e).get("call") is None]
    computing = sum(e["end"] - e["start"] for e in mine
                    if e["kind"] == "compute" and e["label"].startswith("gradient"))
    waiting = sum(e["end"] - e["start"] for e in mine
                  if e["kind"] == "recv" and info(e).get("kind") == "pull")
    span = max(e["end"] for e in mine) - begin
    return computing / 1e9, waiting / 1e9, span / 1e9


idle = {}
for name, straggler in (("no straggler", None), ("worker 2 sleeps 20 ms", (2, 0.02))):
    path = OUT / f"ps_idle_{'none' if straggler is None else 'straggler'}.trace.jsonl"
    minidist.launch(train_mlp_on_digits, world_size=4, args=(IDLE_STEPS,),
                    kwargs=dict(servers=1, straggler=straggler), trace=str(path))
    events = trace.read_jsonl(path).events
    idle[name] = [worker_time_split(events, rank) for rank in (1, 2, 3)]
    for worker, (computing, waiting, span) in enumerate(idle[name]):
        print(f"{name:>22}, worker {worker}: computing {computing * 1e3:6.1f} ms, waiting for "
              f"pulls {waiting * 1e3:6.1f} ms of {span * 1e3:6.1f} ms "
              f"({waiting / span:4.0%} idle)")

figure, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=False)
for axis, (name, split) in zip(axes, idle.items()):
    workers = np.arange(len(split))
    axis.bar(workers, [c * 1e3 for c, _, _ in split], label="gradient", color="C2")
    axis.bar(workers, [w * 1e3 for _, w, _ in split], bottom=[c * 1e3 for c, _, _ in split],
             label="waiting for the pull", color="C7")
    axis.set_xticks(workers)
    axis.set_xticklabels([f"worker {k}" for k in workers])
    axis.set_ylabel("ms")
    axis.set_title(f"BSP, {IDLE_STEPS} steps: {name}")
    axis.set_ylim(0, 1.35 * max((c + w) * 1e3 for c, w, _ in split))   # room for the legend
    axis.legend(fontsize=8, loc="upper center", ncol=2)
figure.tight_layout()
show_figure(figure, "ps_idle.png")

calm, slowed = idle["no straggler"], idle["worker 2 sleeps 20 ms"]
glue("idle_least", min(w / span for _, w, span in calm), ".0%")
glue("idle_most", max(w / span for _, w, span in calm), ".0%")
glue("idle_verdict", "already wait for most of each step"
     if min(w / span for _, w, span in calm) > 0.5 else "wait for part of each step")
glue("gradient_ms", np.mean([c for c, _, _ in calm]) / IDLE_STEPS * 1e3, "{:.2f} ms")
glue("step_ms", np.mean([span for _, _, span in calm]) / IDLE_STEPS * 1e3, "{:.1f} ms")
fast = [w / span for _, w, span in slowed[:2]]
glue("fast_idle_least", min(fast), ".0%")
glue("fast_idle_verdict", "wait almost the whole run" if min(fast) > 0.9 else
     "wait for most of the run")
glue("slow_step_ms", max(span for _, _, span in slowed) / IDLE_STEPS * 1e3, "{:.1f} ms")
computing, waiting, _ = (round(v * 1e3, 1) for v in slowed[2])   # ms, as printed
glue("straggler_computing", computing, "{:.1f} ms")
glue("straggler_waiting", waiting, "{:.1f} ms")
glue("straggler_green", computing / (computing + waiting), ".0%")
glue("straggler_verdict", "mostly green" if computing > waiting else "not even mostly green")

# %% jupyter={"source_hidden": true}
say("""
Without a straggler the workers {glue}`idle_verdict` ({glue}`idle_least` to
{glue}`idle_most` of their time): a gradient of this small model takes
{glue}`gradient_ms` on average, while a whole step, with its messages and the switching
between 4 processes on 2 cores (shared with anything else the machine runs),
takes {glue}`step_ms`. With the straggler, the two fast workers
{glue}`fast_idle_verdict` (at least {glue}`fast_idle_least` idle): a step now
lasts {glue}`slow_step_ms`, worker 2's 20 ms of sleep and a little more, as in
lesson 5's stragglers. (The straggler's sleep counts as its "gradient" time,
which is why its own bar, its gradient time on top of which sits its waiting,
is {glue}`straggler_verdict`: {glue}`straggler_computing` of
{glue}`straggler_computing` + {glue}`straggler_waiting`, {glue}`straggler_green`.
The bar leaves out the rest of the worker's span, its sends and its
bookkeeping.)
""")

# %% [markdown]
# That waiting is what the asynchronous modes give up: lesson 8 lets the
# fast workers go on, and measures what it costs in staleness.
#
# Try: section 4's code cell launches `train_mlp_on_digits` once per
# (workers, servers) pair of its loop, `for workers, servers in ((2, 1),
# (3, 1), (4, 1), (3, 2))`; add `mode="async"` to the `kwargs` of that
# launch for the pair (4, 1) and check that the bytes per step do not change (asynchrony saves waiting, not bytes); in
# section 6's code cell, change `servers=1` in its launch to `servers=2`: the idle time stays, since it comes from the
# barrier and not from the server's load.

# %% [markdown]
# ## Your turn
#
# Write one push/pull round with send and recv:
# `minidist exercise start parameter_server_round`, then
# `minidist exercise check parameter_server_round`.
