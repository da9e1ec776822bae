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
# # Lesson 23: clusters have a shape
#
# Every simulated network of the course so far was flat: any two ranks
# talked over the same link, one α and one β (lessons 2 to 4). A real
# cluster has two levels. Inside a **node**, 8 GPUs talk over NVLink or
# PCIe, fast links private to each pair. Between nodes, a message leaves
# through one of the node's **NICs** (network cards) and crosses the
# network: a slower link, and shared, since the ranks of a node share its
# NICs. The questions people ask of NCCL are about exactly that: why a
# ring across nodes is as slow as its slowest hop, when a tree beats a
# ring, what "bus bandwidth" means, why an all_reduce in two levels.
#
# 1. the two-level model, on two clusters of the field: NVIDIA DGX H100
#    nodes and commodity PCIe nodes with one Ethernet NIC;
# 2. ring, tree and hierarchical all_reduce on the simulator, from 8 to
#    4,096 ranks, on both clusters: where each wins, and why;
# 3. bus bandwidth, as nccl-tests defines it, and what it says of each
#    algorithm;
# 4. a 3D plan of lesson 17's planner predicted again on each cluster;
# 5. where a real run's time went: a profile of DDP on real processes with
#    and without overlap;
# 6. the planner as a page to play with.
#
# Library code: `minidist/topology.py` (the clusters, their presets and
# sources), the simulator's network on two levels
# (`minidist/distributed/transport/sim.py`), the two-level formulas
# (`minidist/distributed/collectives/topology_costs.py`), the hierarchical
# algorithms (`collectives/hierarchical.py`, `ring_2d.py`, `nccl_tree.py`),
# the planner (`minidist/parallel/mesh/plan_command.py`'s `machine_of`),
# the profile (`minidist/profile/`) and the page (`viz/planner_page.py`).
#
# Symbols as in `lessons/NOTATION.md`: α and β of a link (its latency, and
# the price of one of its bytes: 1 / bandwidth), N the bytes of the array,
# n the ranks; for a cluster, G ranks a node (so n / G nodes), and a
# subscript says which link: α_intra, β_intra inside a node, α_inter,
# β_inter between nodes.
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`)
# simulates 8, 64 and 512 ranks and profiles 3 DDP steps; the full form
# adds 4,096 ranks and profiles 6 steps.

# %%
import numpy as np

import minidist
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    show_page,
    use_headless_matplotlib,
)

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from minidist.distributed import simulate  # noqa: E402
from minidist.topology import PRESETS  # noqa: E402

QUICK = quick()
OUT = output_dir()


def table(rows, header):
    """Rows under a header, right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(f"{str(h):>{w}}" for h, w in zip(header, widths))]
    lines += ["  ".join(f"{str(c):>{w}}" for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def rate(beta):
    """A link's bandwidth, 1 / beta, in GB/s."""
    return f"{1 / beta / 1e9:.3g} GB/s"


# %% [markdown]
# ## 1. Two levels: fast inside a node, slow and shared between
#
# `minidist.topology` describes a cluster by its nodes, the ranks of
# a node (G), the link inside a node (α_intra, β_intra), the link of a
# NIC (α_inter, β_inter) and the NICs a node has. Two presets, with the
# figures their makers publish:
#
# * `dgx`: NVIDIA's DGX H100 (its datasheet): 8 GPUs on NVLink, 900 GB/s a
#   GPU counting both directions, so 450 GB/s each way; and 8 ConnectX-7
#   InfiniBand NICs of 400 Gb/s, one beside each GPU;
# * `commodity`: 8 GPUs on PCIe 4.0 x16 (the PCI-SIG specification: about
#   32 GB/s each way) and one 100 Gb Ethernet NIC for the whole node
#   (IEEE 802.3), which its 8 ranks share.
#
# The latencies are orders of magnitude, those of NCCL's own tuning model
# (`src/graph/tuning.cc`), not measurements.

# %%
clusters = {name: PRESETS[name](2) for name in ("dgx", "commodity")}
for name, cluster in clusters.items():
    print(cluster.describe())
dgx2, commodity2 = clusters["dgx"], clusters["commodity"]
glue("dgx_intra", rate(dgx2.intra.beta))
glue("dgx_inter", rate(dgx2.inter.beta))
glue("com_intra", rate(commodity2.intra.beta))
glue("com_inter", rate(commodity2.inter.beta))
glue("com_share", rate(commodity2.inter.beta * commodity2.ranks_per_node))
glue("dgx_ratio", dgx2.inter.beta / dgx2.intra.beta, ".0f")
glue("com_ratio", commodity2.inter.beta / commodity2.intra.beta, ".1f")

# %% [markdown]
# What the second level does to lesson 4's ring. On one node, the ring's
# 2(n-1) steps each send one n-th of the array over NVLink or PCIe. On
# two nodes, two of the ring's links leave a node, one from each node;
# every rank waits in each step for its neighbour's message, so every step
# runs at the pace of the slowest hop, the NIC's:
# 2(n-1)(α_inter + (N / n) β_inter), plus the reductions'
# (n-1)/n Nγ (γ = 0 in both presets). Only one rank of a node leaves it
# in a ring step, so the ring has the card to itself, even on the
# commodity node. The simulator charges each message by the link it
# crosses (a shared NIC takes one message at a time), and the same
# algorithm code runs on it.

# %%
N = 64 << 20
rows = []
ring = {}
for name in clusters:
    for nodes in (1, 2):
        cluster = PRESETS[name](nodes)
        result = simulate("all_reduce", "ring", world_size=cluster.world_size, nbytes=N,
                          topology=cluster)
        ring[name, nodes] = result.time
        rows.append((name, nodes, cluster.world_size, f"{result.time * 1e3:.2f} ms",
                     f"{result.predicted * 1e3:.2f} ms"))
print(f"ring all_reduce of {N >> 20} MiB a rank")
print(table(rows, ["cluster", "nodes", "ranks", "simulated", "two-level formula"]))
glue("N_mib", N >> 20)
glue("dgx_slowdown", ring["dgx", 2] / ring["dgx", 1], ".1f")
glue("com_slowdown", ring["commodity", 2] / ring["commodity", 1], ".1f")
exact = all(row[3] == row[4] for row in rows)
glue("ring_exact", exact)
glue("ring_exact_text", "equals, to the printed digit, the two-level formula" if exact else
     "differs from the two-level formula")

# %% jupyter={"source_hidden": true}
say("""
Inside a DGX node a byte costs {glue}`dgx_ratio` times less than between
nodes ({glue}`dgx_intra` against {glue}`dgx_inter` a NIC); inside a
commodity node {glue}`com_ratio` times less ({glue}`com_intra` against
{glue}`com_inter`), and its one NIC is shared by 8 ranks: when all send
off the node at once, each gets {glue}`com_share` (the ring does not do
that; section 2's algorithms do). The ring of {glue}`N_mib` MiB on two
nodes takes {glue}`dgx_slowdown` times its time on one DGX node, and
{glue}`com_slowdown` times on commodity nodes: each step now runs at the
pace of the link that leaves the node. The simulated time
{glue}`ring_exact_text` written above.
""")

# %% [markdown]
# ## 2. Ring, tree or two levels: which all_reduce, where
#
# Three kinds of all_reduce meet the two levels differently:
#
# * the **ring** (lesson 4) sends 2(n-1)/n N bytes a rank, the fewest any
#   all_reduce can, but in 2(n-1) steps one after another: its latency
#   grows with n, and on two levels every step pays α_inter;
# * a **tree** (lesson 3's reduce then broadcast) or recursive doubling's
#   butterfly (lesson 3) needs only about log₂ n steps (2 log₂ n for the
#   tree's two passes), but sends the whole array N at each: few latencies,
#   many bytes;
# * the **hierarchical** all_reduce does the work in two levels: a
#   reduce_scatter inside each node (each of the G ranks ends with the sum
#   of its node's N / G piece), an all_reduce of those pieces across the
#   nodes among the ranks with the same place in their node (Rabenseifner's
#   recursive halving and doubling: log₂ of the nodes steps; on a DGX each
#   local rank over its own NIC), and an all_gather inside each node. Only
#   N / G bytes a rank leave a node. The **2D ring** does the same with a
#   ring across the nodes instead (2(n / G - 1) steps). **NCCL's tree**
#   runs two binary trees over the nodes, each carrying half the array, so
#   that every node sends and receives at full rate (a "double binary
#   tree": Sanders, Speck and Träff, "Two-tree algorithms for full
#   bandwidth broadcast, reduction and scan", 2009), and inside each node
#   a chain: the node's ranks pass the data along one after another.
#
# The simulator runs each one's own code on both clusters, from 8 to
# 4,096 ranks (512 in the quick form), for a small array and a large
# one. In the full form the 2D ring and NCCL's tree stop at 512 ranks
# ("-" in its table at 4,096): their ranks do different things, so the
# simulator cannot let one rank's run stand for the others' and runs every
# rank, which at 4,096 takes minutes on two cores. The picture below
# draws the tables.

# %%
ALGORITHMS = ["ring", "recursive_doubling", "reduce_broadcast", "hierarchical", "ring_2d",
              "nccl_tree"]
WORLDS = [8, 64, 512] + ([] if QUICK else [4096])
#: Every rank of these runs (no rank stands for the others), one simulated
#: message at a time: minutes at 4,096 ranks on two cores, so they stop at 512.
SLOW, SLOW_ABOVE = ("ring_2d", "nccl_tree"), 512
SIZES = {"8 KiB": 8 << 10, "64 MiB": 64 << 20}
times = {}
for name in clusters:
    for n in WORLDS:
        cluster = PRESETS[name](max(n // 8, 1))
        for label, nbytes in SIZES.items():
            for algorithm in ALGORITHMS:
                if n > SLOW_ABOVE and algorithm in SLOW:
                    continue
                result = simulate("all_reduce", algorithm, world_size=n, nbytes=nbytes,
                                  topology=cluster)
                times[name, n, label, algorithm] = result.time
winners = {}
for name in clusters:
    rows = []
    for n in WORLDS:
        for label in SIZES:
            found = {a: times[name, n, label, a] for a in ALGORITHMS
                     if (name, n, label, a) in times}
            best = min(found, key=found.get)
            winners[name, n, label] = best
            rows.append((n, label, *(f"{found[a] * 1e3:.3g}" if a in found else "-"
                                     for a in ALGORITHMS), best))
    print(f"{name}: simulated all_reduce, ms")
    print(table(rows, ["ranks", "array", *ALGORITHMS, "fastest"]))
    print()

figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
for row, name in enumerate(clusters):
    for column, label in enumerate(SIZES):
        axis = axes[row][column]
        for index, algorithm in enumerate(ALGORITHMS):
            shown = [n for n in WORLDS if (name, n, label, algorithm) in times]
            axis.plot(shown, [times[name, n, label, algorithm] * 1e3 for n in shown],
                      marker="o", label=algorithm, color=f"C{index}")
        axis.set_xscale("log")
        axis.set_xticks(WORLDS, [f"{n:,}" for n in WORLDS])
        axis.minorticks_off()
        axis.set_yscale("log")
        # Plain numbers on the log axis (0.01, not 10 to the -2 in TeX's fonts).
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_title(f"{name}: all_reduce of {label} a rank")
        axis.set_ylabel("simulated time (ms)")
        axis.grid(alpha=0.3, which="both")
for axis in axes[1]:
    axis.set_xlabel("ranks (8 a node)")
axes[0][0].legend(fontsize="small")
figure.tight_layout()
show_figure(figure, "all_reduce_on_two_levels.png",
            "simulated all_reduce time against the ranks, each algorithm, on both clusters")

big = WORLDS[-1]


def winner(name, n, label):
    return winners[name, n, label]


def cell(name, n, label, algorithm):
    return times[name, n, label, algorithm]


glue("big_n", big, ",")
glue("times_table", {f"{k[0]}/{k[1]}/{k[2]}/{k[3]}": v for k, v in times.items()})
glue("dgx_small_winner", winner("dgx", big, "8 KiB"))
glue("com_small_winner", winner("commodity", big, "8 KiB"))
glue("one_node_dgx", winner("dgx", 8, "64 MiB"))
glue("one_node_com", winner("commodity", 8, "64 MiB"))
glue("hier_is_ring_on_one_node", all(
    cell(c, 8, "64 MiB", "hierarchical") == cell(c, 8, "64 MiB", "ring") for c in clusters))
glue("dgx_large_64", winner("dgx", 64, "64 MiB"))
glue("dgx_hier_gain_64", cell("dgx", 64, "64 MiB", "ring") / cell("dgx", 64, "64 MiB",
                                                                   "hierarchical"), ".1f")
glue("dgx_large_big", winner("dgx", big, "64 MiB"))
glue("com_large_64", winner("commodity", 64, "64 MiB"))
glue("com_hier_over_ring_64", cell("commodity", 64, "64 MiB", "hierarchical")
     / cell("commodity", 64, "64 MiB", "ring"), ".2f")
glue("com_large_big", winner("commodity", big, "64 MiB"))
glue("com_ring_over_hier_big", cell("commodity", big, "64 MiB", "ring")
     / cell("commodity", big, "64 MiB", "hierarchical"), ".1f")
ring_latency = 2 * (big - 1) * commodity2.inter.alpha
ring_big = cell("commodity", big, "64 MiB", "ring")
glue("com_ring_latency", ring_latency * 1e3, ".1f")
glue("com_ring_big", ring_big * 1e3, ".1f")
glue("com_latency_verdict", "more than its bytes" if ring_latency > ring_big - ring_latency
     else "about half, the bytes the rest" if ring_latency > 0.4 * ring_big
     else "the bytes the rest")
glue("rd_over_rb_com_big", cell("commodity", big, "8 KiB", "recursive_doubling")
     / cell("commodity", big, "8 KiB", "reduce_broadcast"), ".1f")

# %% jupyter={"source_hidden": true}
say("""
**Small arrays** (8 KiB) are latency: few steps matter most. At
{glue}`big_n` ranks the fastest on DGX nodes is {glue}`dgx_small_winner`
(log₂ n exchanges). On commodity nodes it is {glue}`com_small_winner`,
and recursive doubling takes {glue}`rd_over_rb_com_big` times as long:
in each of its rounds that cross nodes, all 8 ranks of a node send at
once through the one NIC, one message after another, where a reduce and
a broadcast move one message per node at a time.

**Large arrays** (64 MiB) are bytes. On one node (8 ranks) the fastest is
{glue}`one_node_dgx` on DGX and {glue}`one_node_com` on commodity nodes,
tied with the hierarchical all_reduce and the 2D ring, which are the ring
there (one node, no second level). On 64 DGX ranks the fastest is {glue}`dgx_large_64`,
{glue}`dgx_hier_gain_64` times faster than the ring: only 1/G of the
array crosses the network, each of the 8 ranks over its own NIC, and the
reduce_scatter and all_gather inside the node run on NVLink. At
{glue}`big_n` ranks the fastest is again {glue}`dgx_large_big`.

On commodity nodes the fastest on 64 ranks is {glue}`com_large_64`, and
the hierarchical one takes {glue}`com_hier_over_ring_64` times its time:
its middle phase sends from all 8 ranks of a node at once through the one
NIC, while the ring's steps leave each node from one rank only, so
splitting the array buys nothing there. At {glue}`big_n` ranks the
fastest is {glue}`com_large_big`: the ring's 2(n-1) steps each pay
α_inter, {glue}`com_ring_latency` ms of its {glue}`com_ring_big` ms
({glue}`com_latency_verdict`), and the ring takes
{glue}`com_ring_over_hier_big` times the hierarchical one's time. Which
all_reduce is best depends on the cluster's shape and on n, which is why
NCCL picks one by a model of both (and `algorithm="auto"` does here, on
the two-level model, once `minidist.topology.use(...)` names the
cluster).
""")

# %% [markdown]
# ## 3. Bus bandwidth: one number to set beside the links
#
# nccl-tests, NVIDIA's benchmark of NCCL, prints two bandwidths for each
# collective (its `PERFORMANCE.md`): the **algorithm bandwidth**
# algbw = N / t, the array's bytes over the time, and the **bus
# bandwidth** busbw = algbw × 2(n-1)/n for an all_reduce ((n-1)/n for an
# all_gather or a reduce_scatter, 1 for a broadcast). The factor is the
# ring's: a ring all_reduce sends 2(n-1)/n N bytes a rank, so its busbw is
# the rate at which each rank's link carried bytes, whatever n. That is
# why busbw is the number to set beside a link's bandwidth: a ring whose
# busbw reaches the slowest link's bandwidth uses it to the full.
#
# The same simulated runs of 64 MiB, on 64 ranks (8 nodes):

# %%
from minidist.bench.cases import bus_factor  # noqa: E402

n_bus = 64
rows, busbw = [], {}
for name in clusters:
    for algorithm in ALGORITHMS:
        t = times[name, n_bus, "64 MiB", algorithm]
        algbw = SIZES["64 MiB"] / t
        busbw[name, algorithm] = algbw * bus_factor("all_reduce", n_bus)
        rows.append((name, algorithm, f"{t * 1e3:.3g}", f"{algbw / 1e9:.3g}",
                     f"{busbw[name, algorithm] / 1e9:.3g}"))
print(f"all_reduce of 64 MiB on {n_bus} ranks (8 nodes)")
print(table(rows, ["cluster", "algorithm", "ms", "algbw GB/s", "busbw GB/s"]))
glue("n_bus", n_bus)
glue("dgx_ring_busbw", busbw["dgx", "ring"] / 1e9, ".3g")
glue("dgx_nic", 1 / dgx2.inter.beta / 1e9, ".3g")
glue("dgx_ring_busbw_share", busbw["dgx", "ring"] * dgx2.inter.beta * 100, ".0f")
glue("dgx_hier_busbw", busbw["dgx", "hierarchical"] / 1e9, ".3g")
glue("dgx_hier_over_nic", busbw["dgx", "hierarchical"] * dgx2.inter.beta, ".1f")
glue("com_ring_busbw", busbw["commodity", "ring"] / 1e9, ".3g")
glue("com_hier_busbw", busbw["commodity", "hierarchical"] / 1e9, ".3g")
glue("dgx_ring_latency", 2 * (n_bus - 1) * dgx2.inter.alpha * 1e3, ".2f")
glue("dgx_ring_ms", times["dgx", n_bus, "64 MiB", "ring"] * 1e3, ".2f")
glue("com_ring_busbw_share", busbw["commodity", "ring"] * commodity2.inter.beta * 100, ".0f")
glue("com_nic_share", 1 / (commodity2.inter.beta * commodity2.ranks_per_node) / 1e9, ".3g")

# %% jupyter={"source_hidden": true}
say("""
On DGX nodes the ring's busbw is {glue}`dgx_ring_busbw` GB/s:
{glue}`dgx_ring_busbw_share` % of one NIC's {glue}`dgx_nic` GB/s, the
slowest link its every step crosses; the rest of its time is its 2(n-1)
latencies ({glue}`dgx_ring_latency` ms of {glue}`dgx_ring_ms` ms). The hierarchical all_reduce's busbw
is {glue}`dgx_hier_busbw` GB/s, {glue}`dgx_hier_over_nic` times the NIC's:
not because a link got faster, but because only one G-th of the array
leaves each node, while busbw still counts the ring's 2(n-1)/n N bytes.
So a busbw above the slowest link says the algorithm sent fewer bytes over
it than a ring would. On commodity nodes the ring's busbw is
{glue}`com_ring_busbw` GB/s, {glue}`com_ring_busbw_share` % of the whole
NIC: in each ring step one rank of a node leaves it, so the ring has the
card to itself. The hierarchical one's is {glue}`com_hier_busbw` GB/s,
lower: it sends fewer bytes off the node, but all 8 ranks at once,
{glue}`com_nic_share` GB/s each, so on this cluster it gains nothing.
""")

# %% [markdown]
# ## 4. A 3D plan on each cluster
#
# Lesson 17's planner predicts a GPT training step on a dp x tp x pp mesh
# from the FLOPs, the cost model and the pipeline's clock. Given a
# topology, its node size and links are the cluster's: tensor parallelism
# inside a node runs on the intra link, and data parallel and the
# pipeline, which send from every rank at once, on each rank's share of
# its node's NICs. The 6.7 B GPT of `minidist plan` (32 layers, width
# 4,096, 4,096 tokens a sequence, 1,024 sequences a step) on 1,024 ranks,
# 128 nodes of each cluster, with the same GPUs (the planner's FLOP/s,
# printed below) and 80 GB of memory a rank:

# %%
from minidist.parallel.mesh import CLUSTER, GPTShape, Plan, compare_plans, predict_step  # noqa: E402
from minidist.parallel.mesh.plan_command import machine_of  # noqa: E402

gpt = GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
               global_batch=1024, micro_batch=1)
plans = [Plan(dp=8, tp=8, pp=16), Plan(dp=4, tp=16, pp=16)]
rows, steps, best = [], {}, {}
print(f"every rank {CLUSTER.flops / 1e12:g} TFLOP/s, 80 GB")
for name in clusters:
    machine = machine_of(PRESETS[name](128), CLUSTER.flops)
    for plan in plans:
        step = predict_step(gpt, plan, machine)
        steps[name, str(plan)] = step
        rows.append((name, str(plan), f"{step.compute:.3f}", f"{step.tp_comm:.3f}",
                     f"{step.pp_bubble:.3f}", f"{step.dp_comm:.3f}", f"{step.total:.3f}"))
    best[name] = compare_plans(gpt, 1024, machine, memory_limit=80e9).best
print(table(rows, ["cluster", "plan", "compute s", "TP s", "PP bubble s", "DP s", "step s"]))
for name, found in best.items():
    print(f"{name}: the fastest plan that fits in 80 GB a rank: {found.plan}, "
          f"{found.total:.3f} s a step")
inside, across = str(plans[0]), str(plans[1])
glue("tp_inside", inside)
glue("tp_across", across)
glue("dgx_tp_inside", steps["dgx", inside].tp_comm, ".3f")
glue("dgx_tp_across", steps["dgx", across].tp_comm, ".2f")
glue("dgx_tp_ratio", steps["dgx", across].tp_comm / steps["dgx", inside].tp_comm, ".0f")
glue("com_step_inside", steps["commodity", inside].total, ".2f")
glue("dgx_step_inside", steps["dgx", inside].total, ".2f")
glue("com_bubble", steps["commodity", inside].pp_bubble, ".2f")
glue("dgx_bubble", steps["dgx", inside].pp_bubble, ".2f")
glue("com_tp", steps["commodity", inside].tp_comm, ".2f")
glue("com_dp", steps["commodity", inside].dp_comm, ".2f")
glue("com_over_dgx", steps["commodity", inside].total / steps["dgx", inside].total, ".1f")
glue("dgx_best", str(best["dgx"].plan))
glue("com_best", str(best["commodity"].plan))
glue("best_differ", str(best["dgx"].plan) != str(best["commodity"].plan))
glue("best_text", "another plan" if str(best["dgx"].plan) != str(best["commodity"].plan)
     else "the same plan")

# %% jupyter={"source_hidden": true}
say("""
With tp = 8, tensor parallelism stays inside a node: its collectives
take {glue}`dgx_tp_inside` s of a DGX step (the table's TP column). With tp = 16 each tensor-parallel
group spans two nodes, and the same collectives take {glue}`dgx_tp_across`
s, {glue}`dgx_tp_ratio` times more: this is why tensor parallelism is kept
inside a node (the Ultra-Scale Playbook's advice, Hugging Face, 2025). The
same plan ({glue}`tp_inside`) takes {glue}`com_step_inside` s a step on
commodity nodes against {glue}`dgx_step_inside` s on DGX nodes,
{glue}`com_over_dgx` times as long, with the same GPUs' compute. Most of
the difference is the pipeline's bubble ({glue}`com_bubble` s against
{glue}`dgx_bubble` s): the planner's bubble is the time a stage does no
work of its own, the fill and drain of lesson 9 and also every wait for
an activation or a gradient from the next node, and those cross one
shared 100 Gb NIC. Tensor parallelism on PCIe instead of NVLink adds
{glue}`com_tp` s against {glue}`dgx_tp_inside` s; data parallel's
gradients {glue}`com_dp` s. The fastest plan that fits is
{glue}`dgx_best` on DGX nodes and {glue}`com_best` on commodity ones:
{glue}`best_text`, chosen for the cluster.
""")

# %% [markdown]
# ## 5. Where a real run's time went
#
# The figures above are predictions. On real processes, `minidist profile
# TRACE` (and `minidist.profile.profile`) reads any trace and splits each
# rank's time, in the spirit of Meta's Holistic Trace Analysis (HTA):
# **compute**, communication **overlapped** with compute, **exposed**
# communication (the rank did nothing else), **waiting** for a peer (a
# receive posted before its send began, a collective entered before the
# last member), and **unmarked** time (setup, the optimizer: no event
# covers it). Lessons 5 and 13 made DDP send its buckets while backward still
# computes (`overlap=True`); here the same DDP on 2 real processes, with
# overlap and without, each profiled.

# %%
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from minidist import Tensor, nn, optim, trace  # noqa: E402
from minidist.parallel.data import DistributedDataParallel  # noqa: E402
from minidist.profile import profile  # noqa: E402
from viz.profile_bars import draw_profile_bars  # noqa: E402

PROFILE_STEPS = 3 if QUICK else 6


def ddp_steps(overlap: bool, steps: int):
    """DDP of a 7-layer MLP, a bucket of one layer's weights (so that the last
    layers' buckets are ready while backward computes the first ones)."""
    nn.init.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 10))
    wrapped = DistributedDataParallel(model, bucket_cap_mb=0.25, overlap=overlap,
                                      algorithm="ring")
    optimizer = optim.SGD(wrapped.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x, y = rng.normal(size=(256, 256)).astype(np.float32), rng.integers(0, 10, 256)
        optimizer.zero_grad()
        with trace.region("forward"):
            loss = loss_fn(wrapped(Tensor(x)), y)
        with trace.region("backward"):
            loss.backward()
        optimizer.step()


folder = Path(tempfile.mkdtemp(prefix="lesson23_"))
profiles = {}
for overlap in (True, False):
    path = folder / f"ddp_overlap_{overlap}.jsonl"
    minidist.launch(ddp_steps, world_size=2, transport="shm", args=(overlap, PROFILE_STEPS),
                    trace=str(path))
    profiles[overlap] = profile(str(path))
rows = []
for overlap, found in profiles.items():
    whole = found.overall
    rows.append(("on" if overlap else "off", f"{whole.ns('compute') / 1e6:.1f}",
                 f"{whole.ns('overlapped') / 1e6:.1f}", f"{whole.ns('exposed') / 1e6:.1f}",
                 f"{whole.ns('waiting') / 1e6:.1f}", f"{whole.overlap_percent:.0f} %"))
print(f"DDP on 2 ranks, {PROFILE_STEPS} steps, both ranks together (ms)")
print(table(rows, ["overlap", "compute (all)", "of it, comm in flight", "comm exposed",
                   "waiting", "overlapped share"]))
longest = max(max(rank.ns("span") for rank in found.ranks.values())
              for found in profiles.values()) / 1e6
for overlap, found in profiles.items():
    figure = draw_profile_bars(found, title=f"DDP, overlap {'on' if overlap else 'off'}")
    figure.axes[0].set_xlim(0, longest * 1.15)   # both pictures on one scale
    show_figure(figure,
                f"profile_overlap_{'on' if overlap else 'off'}.png",
                f"where each rank's time went, DDP with overlap {'on' if overlap else 'off'}")
on, off = profiles[True].overall, profiles[False].overall
glue("overlap_on", on.overlap_percent, ".0f")
glue("overlap_off", off.overlap_percent, ".0f")
glue("exposed_on", on.ns("exposed") / 1e6, ".1f")
glue("exposed_off", off.ns("exposed") / 1e6, ".1f")
glue("on_more", on.overlap_percent > off.overlap_percent)
glue("on_more_text", "more" if on.overlap_percent > off.overlap_percent else "NOT more")
glue("exposed_less", on.ns("exposed") < off.ns("exposed"))
ratio = on.ns("exposed") / max(off.ns("exposed"), 1)
glue("exposed_ratio", ratio, ".2f")
glue("exposed_verdict", "less with overlap on, the time overlap saves" if ratio < 0.9 else
     "about the same in this run" if ratio <= 1.1 else
     "more with overlap on, in this run: communication moved under compute, but the part "
     "the step sat in did not shrink")
import shutil  # noqa: E402

shutil.rmtree(folder, ignore_errors=True)

# %% jupyter={"source_hidden": true}
say("""
The "compute" column is all of a rank's compute, the "comm in flight"
column the part of it during which a collective was in flight; the
overlapped share is that part over all communication (in flight, exposed
and waiting). With overlap on, {glue}`overlap_on` % of DDP's
communication ran while the rank computed; with it off,
{glue}`overlap_off` %: {glue}`on_more_text` with overlap on, as lessons 5
and 13 built it. The exposed communication, the part the step sits in, is
{glue}`exposed_on` ms against {glue}`exposed_off` ms:
{glue}`exposed_verdict`. The pictures below draw each rank's time stacked
by kind (not in time order), both on one scale. On 2 cores shared by two
ranks the amounts move from run to run (a rank can be taken off its core
in the middle of a computation), and the quick form's 3 steps are few.
""")

# %% [markdown]
# ## 6. The planner, to play with
#
# `minidist plan --html plan.html` writes the planner as one page that
# runs offline (its script inline, no network): sliders for the model, the
# batch, dp, tp and pp, ZeRO's stage, sequence parallelism, recomputation,
# the schedule and the machine; the memory of a rank broken down
# (parameters, gradients, optimizer state, activations) against the
# device's, red when it does not fit; a step's time broken down (compute,
# TP, the pipeline's bubble, DP); and the fastest plan that fits, one click
# away. Its numbers are the library's: `predict_step` and `compare_plans`
# ported to JavaScript line by line, held in the suite to the Python for a
# grid of settings in a real browser. It starts here on the 6.7 B GPT of
# section 4, dp8 tp8 pp16, with the DGX preset's links (its list of
# machines has both of section 4's clusters; the page keeps one latency
# for every machine, its default cluster's, so its times differ a little
# from section 4's). Its own labels name the model's sizes as the planner
# does (h the width, a the heads, s the sequence, b the micro-batch),
# not as NOTATION.md does.

# %%
from viz.planner_page import write_page  # noqa: E402

from viz.planner_page import MACHINES  # noqa: E402

dgx_machine = next(preset for name, preset in MACHINES.items() if name.startswith("dgx"))
page = write_page(OUT / "planner.html", {"dp": 8, "tp": 8, "pp": 16, **dgx_machine})
show_page(page, "the planner page: move a slider, the memory and the step's time follow")
