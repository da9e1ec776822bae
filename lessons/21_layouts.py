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
# # Lesson 21: layouts
#
# Every sharding of the course so far was written by hand: ZeRO cut the
# optimizer's state into n pieces (lesson 12), Megatron's column split
# kept rows of a weight and its row split columns (lessons 10 and 17),
# sequence parallelism cut the activations along T (lesson 17). Each time
# the lesson said in words which rank held which part, and chose the
# collective that moved it. This lesson gives those words a name: a tensor's
# **layout** on a device mesh, one **placement** per mesh dimension, which
# says what each rank holds. PyTorch calls a tensor with a layout a
# **DTensor** (`torch.distributed.tensor`); minidist has the same names.
# Once the layout is named, the collective is not chosen any more: the
# change from one layout to another says which one runs, and how many bytes
# it sends, before it runs.
#
# 1. the three placements, `Shard(d)`, `Replicate()` and `Partial()`, on 4
#    real processes, in torch's names and in the sharding notation of "How
#    to Scale Your Model" (Austin et al., Google DeepMind, 2025);
# 2. a layout on a 2 x 2 mesh: which rank holds which block, drawn;
# 3. every change of layout is one collective: each run on 4 processes
#    with the trace on, its plan printed first, then what the trace says
#    ran, against the plan's bytes and the formula; the table of changes;
# 4. uneven chunks: a 5-row tensor on 4 ranks, torch.chunk's sizes, and the
#    padding they cost;
# 5. the backward of a change of layout is the opposite change, read from
#    the trace of a backward;
# 6. Megatron's MLP as placements: the layout of every intermediate, no
#    message until the Partial is made Replicate; then torch's styles
#    (`parallelize_module`) and the split layers of lesson 10 against one
#    process, with the same messages;
# 7. FSDP2 (`fully_shard`, per-parameter `Shard(0)` DTensors) against FSDP1
#    (flat, padded buffers): the memory ledger per rank, the padding each
#    pads, one step's collectives on the timeline, equal weights;
# 8. a checkpoint saved on one mesh (dp2 x tp2) and loaded on others (tp4,
#    dp4), bit for bit, and which saved chunks each new rank read;
# 9. `clip_grad_norm_` on each rank's shards alone, wrong on every rank,
#    and the global one, right.
#
# Library code: `minidist/distributed/tensor/placements.py` (the
# placements, torch.chunk's sizes, which box a rank holds), `dtensor.py`
# (the DTensor), `redistribute.py` (each change as one collective, its
# plan, its backward), `ops.py` (each op's placement rule: matmul's
# `S(1) x S(0) -> P`); `minidist/parallel/placements/` (torch's styles and
# `parallelize_module` in `styles.py` and `parallelize.py`, FSDP2 in
# `fully_shard.py`, `fsdp_params.py` and `fsdp_state.py`), the split
# layers in `minidist/parallel/tensor/layers.py`, FSDP1 in
# `minidist/parallel/data/fsdp.py`; `minidist/distributed/checkpoint/`
# (`save.py`, `load.py`); `minidist/nn/utils/clip_grad.py` and
# `minidist/distributed/tensor/grad_norm.py` (the norm of sharded
# gradients). The drawings are `viz/dtensor_layout.py` (also
# `minidist viz layout 5x4 --mesh 2x2 --placements "S(0),S(1)"`),
# `viz/timeline.py` and `viz/checkpoint_reads.py`.
#
# Symbols as in `lessons/NOTATION.md`: n ranks in a group, N the bytes of
# a tensor (its whole), `S(d)`, `R` and `P(sum)` the short forms of the
# placements the plans print, X and Y the axes of a mesh in the sharding
# notation, inside whose brackets I and J name a tensor's dims.
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`) runs
# section 3's changes on 4 processes with an 8 x 12 tensor; the full form
# also runs them on 2 processes and with a 64 x 96 tensor. Everything else
# is the same in both: sections 6 to 9 run on 4 processes, pipes, float64
# models small enough to print.

# %%
import numpy as np
from rich.console import Console

import minidist
from minidist import Tensor, trace
from minidist.distributed.tensor import (
    Partial,
    Replicate,
    Shard,
    chunk_sizes,
    distribute_tensor,
    init_device_mesh,
    local_shape_and_offset,
    plan,
)
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

from viz.dtensor_layout import layout_figure, layout_text_view  # noqa: E402

QUICK = quick()
OUT = output_dir()
console = Console(width=100, highlight=False)
#: Every launch of this lesson: 4 processes on pipes, a generous timeout (a small machine).
RANKS = 4
LAUNCH = {"transport": "pipe", "timeout": 240}


def table(rows, header):
    """Rows under a header, right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(f"{str(h):>{w}}" for h, w in zip(header, widths))]
    lines += ["  ".join(f"{str(c):>{w}}" for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def labelled(shape):
    """A tensor whose every element is its flat index: a value says where it came from."""
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)


def box_of(local, shape):
    """The box of the global tensor a rank's local piece holds, read from its values
    (each element of ``labelled(shape)`` is its flat index), as numpy's slices:
    "A[0:2, 0:6]", rows 0 and 1, all 6 columns."""
    if local.size == 0:
        return "nothing"
    rows, columns = np.unravel_index(np.rint(local).astype(np.int64), shape)
    return f"A[{rows.min()}:{rows.max() + 1}, {columns.min()}:{columns.max() + 1}]"


def in_region(events, rank, label):
    """Rank ``rank``'s trace events inside its region ``label``."""
    region = next(e for e in events if e["rank"] == rank and e["kind"] == "compute"
                  and e["label"] == label)
    return [e for e in events if e["rank"] == rank and e is not region
            and region["start"] <= e["start"] and e["end"] <= region["end"]]


def replay(events, label, ranks):
    """What ran inside region ``label``, from the trace: the collectives of rank 0
    (name, algorithm, group size, steps), and every rank's bytes sent to other ranks."""
    calls = [trace.label_info(e["label"]) for e in in_region(events, 0, label)
             if e["kind"] == "collective"]
    sent = [sum(e["bytes"] for e in in_region(events, rank, label)
                if e["kind"] == "send" and e["peer"] != rank) for rank in range(ranks)]
    messages = [sum(1 for e in in_region(events, rank, label)
                    if e["kind"] == "send" and e["peer"] != rank) for rank in range(ranks)]
    return calls, sent, messages


def rank0_messages(events, label):
    """Rank 0's messages inside region ``label``, in order, as the trace replays them:
    "192 B to rank 1, 192 B to rank 1, ..." (a rank's block to itself is a copy, left out)."""
    sends = [e for e in in_region(events, 0, label) if e["kind"] == "send" and e["peer"] != 0]
    return ", ".join(f"{e['bytes']} B to rank {e['peer']}" for e in sends) or "none"


def calls_text(calls):
    if not calls:
        return "no collective"
    return "; ".join(f"{c['collective']} ({c['algorithm']}, {c['world']} ranks, {c['steps']} "
                     f"step{'s' * (int(c['steps']) != 1)})" for c in calls)


# %% [markdown]
# ## 1. Three placements
#
# A **device mesh** arranges the ranks in a grid (lesson 17 drew them): 4
# ranks as a row of 4, or as 2 x 2. A tensor's layout says, for each mesh
# dimension, what the ranks along it hold:
#
# | placement | short | the ranks along the mesh dim hold | sharding notation (mesh axis X) |
# |---|---|---|---|
# | `Shard(0)` | `S(0)` | consecutive pieces of the tensor's dim 0, rank i the i-th | A[I_X, J] |
# | `Shard(1)` | `S(1)` | consecutive pieces of dim 1 | A[I, J_X] |
# | `Replicate()` | `R` | the same whole tensor, each a copy | A[I, J] |
# | `Partial()` | `P(sum)` | a term each, of the tensor's shape; the tensor is their sum, which no rank holds yet | A[I, J]{U_X} |
#
# The notation is Austin et al.'s: A is a tensor of two dims named I and
# J; a subscript says along which mesh axis a dim is cut (I_X: dim I cut
# along X); a dim with no subscript is whole on every rank; {U_X} marks a
# tensor *unreduced* along X, a sum still to be taken over X's ranks. torch
# names the same things per mesh dim: `Shard(0)` on mesh dim X is I_X.
# A Partial comes from an op: a matmul of a tensor cut along its columns
# by one cut along its rows gives each rank a product of its two pieces,
# one term of the whole product (Megatron's row split, lesson 10).
#
# Below, a 4 x 8 tensor whose every element is its own flat index (so that
# a value says where it came from) is laid out each way on a row of 4
# real processes by `distribute_tensor`, and every rank reports what it
# holds. torch's `distribute_tensor` makes a `Partial()` by giving each
# rank the tensor divided by n, so that the n terms add up to it.

# %%
SHAPE_1D = (4, 8)
LAYOUTS_1D = {"S(0)": [Shard(0)], "S(1)": [Shard(1)], "R": [Replicate()], "P(sum)": [Partial()]}


def hold_each_layout():
    """On every rank: its local piece of SHAPE_1D under each 1-D layout."""
    mesh = init_device_mesh("cpu", (RANKS,))
    return {name: np.array(distribute_tensor(labelled(SHAPE_1D), mesh, placements,
                                             src_data_rank=None).to_local().data)
            for name, placements in LAYOUTS_1D.items()}


held_1d = minidist.launch(hold_each_layout, world_size=RANKS, **LAUNCH)
rows, agree_1d = [], True
for name, placements in LAYOUTS_1D.items():
    cells = [name]
    for rank in range(RANKS):
        local = held_1d[rank][name]
        want_shape, _ = local_shape_and_offset(SHAPE_1D, (RANKS,), (rank,), placements)
        agree_1d &= tuple(local.shape) == want_shape
        if name == "P(sum)":
            cells.append(f"{local.shape}: {box_of(local * RANKS, SHAPE_1D)} / {RANKS}")
        else:
            cells.append(f"{local.shape}: {box_of(local, SHAPE_1D)}")
    rows.append(cells)
print(table(rows, ["layout"] + [f"rank {r}" for r in range(RANKS)]))
terms_sum = sum(held_1d[rank]["P(sum)"] for rank in range(RANKS))
partial_whole = bool(np.allclose(terms_sum, labelled(SHAPE_1D)))
print(f"P(sum): the 4 ranks' terms added up give the tensor: {partial_whole}")
for name in ("R", "P(sum)"):
    console.print(layout_text_view(SHAPE_1D, (RANKS,), LAYOUTS_1D[name], color=False))

# %% jupyter={"source_hidden": true}
glue("agree_1d", agree_1d)
glue("agree_1d_text", "every rank's piece has the shape `local_shape_and_offset` computes "
     "for it" if agree_1d else "some rank's piece does not have the shape "
     "`local_shape_and_offset` computes for it")
glue("partial_whole", partial_whole)
glue("partial_text", "add up to the tensor" if partial_whole else "do not add up to the tensor")
glue("s0_rows_per_rank", chunk_sizes(SHAPE_1D[0], RANKS)[0])
glue("s1_columns", ", ".join(map(str, chunk_sizes(SHAPE_1D[1], RANKS))))
say("""
On the real processes {glue}`agree_1d_text`. Under `S(0)` each rank holds
{glue}`s0_rows_per_rank` row of the 4, rank i row i (`A[i:i+1, 0:8]`, numpy's slices of the
tensor A); under `S(1)` the 8 columns are cut into pieces of {glue}`s1_columns`; under `R`
every rank holds everything; under `P(sum)` every rank holds a piece of the whole shape, a
quarter of A, and the four terms {glue}`partial_text`. In the terminal views each element shows the ranks that hold it
(`0123`: all four): under `P(sum)` there is one grid per term, since a term is no copy of the
tensor.
""")

# %% [markdown]
# ## 2. A layout on a 2 x 2 mesh
#
# On a mesh of two dims a layout has two placements, one per mesh dim, and
# they apply left to right: `(Shard(0), Shard(1))` cuts dim 0 along mesh
# dim X (the rows of the mesh), then dim 1 along Y: A[I_X, J_Y], a block
# per rank. `(Shard(0), Shard(0))` cuts dim 0 along X, then cuts each piece
# again along Y: A[I_XY, J], four bands of rows, rank (i, j) the band
# 2i + j (torch's order; the book writes I_XY for the same). `(Replicate(),
# Shard(1))` is A[I, J_Y]: the columns cut along Y, copied along X.
# `(Shard(0), Partial())` is A[I_X, J]{U_Y}: the rows cut along X, and
# along Y a term each.
#
# The ranks sit on the mesh as `init_device_mesh` puts them, row-major:
# rank 2i + j at coordinate (i, j). Each of the 4 processes reports what
# it holds of an 8 x 4 tensor, again of flat indices:

# %%
SHAPE_2D = (8, 4)
MESH_2D = (2, 2)
LAYOUTS_2D = {"(S(0), S(1))": ("A[I_X, J_Y]", [Shard(0), Shard(1)]),
              "(S(0), S(0))": ("A[I_XY, J]", [Shard(0), Shard(0)]),
              "(R, S(1))": ("A[I, J_Y]", [Replicate(), Shard(1)]),
              "(S(0), P(sum))": ("A[I_X, J]{U_Y}", [Shard(0), Partial()])}


def hold_on_a_square():
    """On every rank: its coordinate and its piece of SHAPE_2D under each 2-D layout."""
    mesh = init_device_mesh("cpu", MESH_2D, mesh_dim_names=("X", "Y"))
    return mesh.get_coordinate(), {
        name: np.array(distribute_tensor(labelled(SHAPE_2D), mesh, placements,
                                         src_data_rank=None).to_local().data)
        for name, (_, placements) in LAYOUTS_2D.items()}


held_2d = minidist.launch(hold_on_a_square, world_size=RANKS, **LAUNCH)
rows, agree_2d = [], True
for name, (notation, placements) in LAYOUTS_2D.items():
    cells = [name, notation]
    for rank in range(RANKS):
        coordinate, pieces = held_2d[rank]
        local = pieces[name]
        want_shape, want_offset = local_shape_and_offset(SHAPE_2D, MESH_2D, coordinate,
                                                         placements)
        if "P" in name:   # a term: 1/2 of the elements of its box
            box = box_of(local * 2, SHAPE_2D) + " / 2"
            agree_2d &= tuple(local.shape) == want_shape
        else:
            box = box_of(local, SHAPE_2D)
            agree_2d &= bool(tuple(local.shape) == want_shape and local.flat[0] ==
                             np.ravel_multi_index(want_offset, SHAPE_2D))
        cells.append(box)
    rows.append(cells)
print(table(rows, ["layout", "notation"] + [f"rank {r} {tuple(held_2d[r][0])}"
                                            for r in range(RANKS)]))
for name in ("(S(0), S(1))", "(S(0), S(0))", "(S(0), P(sum))"):
    show_figure(layout_figure(SHAPE_2D, MESH_2D, LAYOUTS_2D[name][1]),
                f"layout_{name.strip('()').replace(', ', '_').replace('(', '').replace(')', '')}.png",
                f"{name} = {LAYOUTS_2D[name][0]} on the 2 x 2 mesh: each element in the "
                "colours of the ranks that hold it", dpi=90)

# %% jupyter={"source_hidden": true}
glue("agree_2d_text", "every rank holds the box `local_shape_and_offset` computes for its "
     "coordinate, its first element where that box starts" if agree_2d else
     "some rank holds another box than `local_shape_and_offset` computes")
glue("agree_2d", agree_2d)
band = box_of(held_2d[1][1]["(S(0), S(0))"], SHAPE_2D)
glue("band_rank1", band)
say("""
On the real processes {glue}`agree_2d_text`. Under `(S(0), S(0))` rank 1, at (0, 1), holds
{glue}`band_rank1`: the second band, inside rank 0's half of the X cut, as the left-to-right
rule says. Under `(S(0), P(sum))` ranks 0 and 1 hold the same rows, each a term of them; the
picture draws the two terms side by side, since adding them is what makes the tensor.
""")

# %% [markdown]
# ## 3. Every change of layout is one collective
#
# `dt.redistribute(mesh, placements)` turns a DTensor's layout into
# another. Each mesh dim whose placement changes is one step (two mesh
# dims that cut the same tensor dim go through `R` first: the plan says
# so), and each step is one collective among the ranks along that mesh dim
# (n of them), named by the change:
#
# * `S(d) -> R`: every rank needs every piece: an **all_gather**;
# * `P -> R`: every rank needs the sum of the terms: an **all_reduce**;
# * `P -> S(d)`: every rank needs the sum of its piece only: a
#   **reduce_scatter**;
# * `R -> S(d)`: every rank holds everything already: it keeps its piece,
#   and nothing is sent;
# * `S(d) -> S(e)`: rank k needs from every rank the part of that rank's
#   piece which falls in its own new piece: an **all_to_all**.
#
# (`R -> P` and `S -> P` are refused, as in torch: a Partial comes from an
# op.) `plan(dt, placements)` says, before anything runs, which steps will
# run and how many bytes each rank sends. Every step runs the ring
# (lesson 4; the all_to_all its pairwise exchange), whose bytes per rank
# are known exactly: for a tensor of N bytes on n ranks, (n - 1)/n N for
# an all_gather and a reduce_scatter, 2 (n - 1)/n N for an all_reduce (its
# reduce_scatter, then its all_gather), and (n - 1)/n² N for an
# all_to_all: each rank holds a piece of N/n, keeps 1/n of it and sends
# the rest, a block to each other rank.
#
# Each change below runs on 4 processes with the trace on, in a trace region
# of its own; the lesson prints its plan, then what the trace says ran
# inside that region: the collectives, and the bytes every rank sent to
# the others. (The full form's other runs, on 2 processes and with the
# bigger tensor, are only rows of the table at the end.)

# %%
CHANGES = [("S(0) -> R", [Shard(0)], [Replicate()]),
           ("P -> R", [Partial()], [Replicate()]),
           ("P -> S(0)", [Partial()], [Shard(0)]),
           ("R -> S(0)", [Replicate()], [Shard(0)]),
           ("S(0) -> S(1)", [Shard(0)], [Shard(1)])]
#: the formula for each change's bytes sent per rank, as a multiple of N, and the
#: collective the table above names
FORMULA = {"S(0) -> R": ("all_gather", lambda n: (n - 1) / n, "(n-1)/n N"),
           "P -> R": ("all_reduce", lambda n: 2 * (n - 1) / n, "2(n-1)/n N"),
           "P -> S(0)": ("reduce_scatter", lambda n: (n - 1) / n, "(n-1)/n N"),
           "R -> S(0)": ("local chunk", lambda n: 0, "0"),
           "S(0) -> S(1)": ("all_to_all", lambda n: (n - 1) / n ** 2, "(n-1)/n^2 N")}
#: (ranks, tensor shape) of each run: the full form adds 2 ranks and a bigger tensor
RUNS = [(4, (8, 12))] + ([] if QUICK else [(2, (8, 12)), (4, (64, 96))])


def run_changes(shape):
    """On every rank: each change of CHANGES in its trace region; what the plan says
    (its text on rank 0, its bytes) and whether the result is the right piece."""
    n = minidist.distributed.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    whole = labelled(shape)
    found = []
    for name, source, target in CHANGES:
        x = distribute_tensor(whole, mesh, source, src_data_rank=None)
        the_plan = plan(x, target)
        with trace.region(name):
            y = x.redistribute(mesh, target)
        want = distribute_tensor(whole, mesh, target, src_data_rank=None).to_local().data
        found.append((str(the_plan), the_plan.nbytes, the_plan.collectives,
                      bool(np.allclose(y.to_local().data, want))))
    return found


change_rows, all_right, all_exact, peers = [], True, True, {}
for n, shape in RUNS:
    path = OUT / f"changes_{n}_{shape[0]}x{shape[1]}.jsonl"
    results = minidist.launch(run_changes, world_size=n, args=(shape,), trace=str(path),
                              **LAUNCH)
    events = trace.read_jsonl(path).events
    whole_bytes = int(np.prod(shape)) * 8
    if (n, shape) == RUNS[0]:
        print(f"\n=== {n} ranks, a float64 tensor of {shape[0]} x {shape[1]}: "
              f"N = {whole_bytes:,} B ===")
    for index, (name, _, _) in enumerate(CHANGES):
        text, planned, collectives, _ = results[0][index]
        right = all(result[index][3] for result in results)
        calls, sent, messages = replay(events, name, n)
        kind, share, formula_text = FORMULA[name]
        formula = round(share(n) * whole_bytes)
        exact = set(sent) == {planned} and planned == formula
        all_right &= right
        all_exact &= exact
        if (n, shape) == RUNS[0]:
            peers[name] = sorted({e["peer"] for e in in_region(events, 0, name)
                                  if e["kind"] == "send" and e["peer"] != 0})
            print(f"\n{text}")
            print(f"  the trace: {calls_text(calls)}; rank 0's messages: "
                  f"{rank0_messages(events, name)}")
            print(f"  bytes sent per rank {', '.join(map(str, sent))} in "
                  f"{', '.join(map(str, messages))} messages; {formula_text} = {formula} B; "
                  f"every rank's piece right: {right}")
        ran = calls[0]["collective"] if calls else "nothing sent"
        change_rows.append((n, f"{shape[0]}x{shape[1]}", name, ran, formula_text, formula,
                            planned, max(sent), "yes" if exact else "NO"))

print("\nThe table, as this run measured it (bytes sent per rank):")
print(table(change_rows, ("n", "tensor", "change", "collective (trace)", "formula", "formula B",
                          "plan B", "trace B", "equal")))

# %% jupyter={"source_hidden": true}
glue("all_right", all_right)
glue("right_text", "every rank ended with the piece of the new layout (compared with "
     "`distribute_tensor` of the whole in that layout)" if all_right else
     "some rank did not end with the piece of the new layout")
glue("all_exact", all_exact)
glue("exact_text", "the bytes every rank sent, read from the trace, were the plan's, and the "
     "plan's were the formula's, for every change" if all_exact else
     "the trace's bytes, the plan's and the formula's were not all the same (the table's "
     "last column says where)")
first_n, first_shape = RUNS[0]
glue("first_n", first_n)
glue("whole_bytes", int(np.prod(first_shape)) * 8, ",")
glue("gather_bytes", round((first_n - 1) / first_n * int(np.prod(first_shape)) * 8), ",")
glue("reduce_bytes", round(2 * (first_n - 1) / first_n * int(np.prod(first_shape)) * 8), ",")
glue("runs_text", " and ".join(f"{n} ranks with a tensor of {s[0]} x {s[1]}" for n, s in RUNS))
glue("ring_peers", ", ".join(map(str, peers["S(0) -> R"])))
glue("ring_one_peer", len(peers["S(0) -> R"]) == 1)
glue("a2a_peers", ", ".join(map(str, peers["S(0) -> S(1)"])))
glue("swap_bytes", round((first_n - 1) / first_n ** 2 * int(np.prod(first_shape)) * 8), ",")
say("""
In every run ({glue}`runs_text`) {glue}`right_text`, and {glue}`exact_text`. On
{glue}`first_n` ranks the tensor of {glue}`whole_bytes` bytes cost {glue}`gather_bytes` bytes per
rank to gather or to reduce-scatter, and twice that, {glue}`reduce_bytes`, to all_reduce a
Partial: the all_reduce is a reduce_scatter and an all_gather. To swap its cut from rows to
columns (the all_to_all) cost {glue}`swap_bytes` bytes per rank, n times less than a
gather: a rank sends only what other ranks lack of its own piece. Going from `R` to a Shard
cost nothing: the trace holds no message in that region. Rank 0's messages show the two
shapes of exchange: every step of the ring's all_gather went to rank {glue}`ring_peers`, its
neighbour, while the all_to_all sent one block to each of ranks {glue}`a2a_peers`.
""")

# %% [markdown]
# On a 2 x 2 mesh a change of both placements is two steps, one collective
# on each mesh dim's groups of 2 ranks, the last mesh dim first (in torch,
# too). From A[I_X, J_Y] to A[I, J] the plan gathers the columns along Y,
# then the rows along X; each rank sends (2 - 1)/2 of the box its group
# holds together, which doubles from the first step to the second:

# %%
def gather_a_square():
    """On every rank: (S(0), S(1)) -> (R, R) of an 8 x 12 tensor on the 2 x 2 mesh."""
    mesh = init_device_mesh("cpu", MESH_2D, mesh_dim_names=("X", "Y"))
    x = distribute_tensor(labelled((8, 12)), mesh, [Shard(0), Shard(1)], src_data_rank=None)
    the_plan = plan(x, [Replicate(), Replicate()])
    with trace.region("two steps"):
        y = x.redistribute(mesh, [Replicate(), Replicate()])
    return (str(the_plan), [step.nbytes for step in the_plan.steps],
            bool(np.array_equal(y.to_local().data, labelled((8, 12)))))


square_path = OUT / "square.jsonl"
square = minidist.launch(gather_a_square, world_size=RANKS, trace=str(square_path), **LAUNCH)
square_events = trace.read_jsonl(square_path).events
square_calls, square_sent, _ = replay(square_events, "two steps", RANKS)
print(square[0][0])
print(f"the trace: {calls_text(square_calls)}; bytes sent per rank "
      f"{', '.join(map(str, square_sent))}; every rank holds the whole tensor: "
      f"{all(result[2] for result in square)}")

# %% jupyter={"source_hidden": true}
step_bytes = square[0][1]
glue("step1_bytes", step_bytes[0], ",")
glue("step2_bytes", step_bytes[1], ",")
glue("square_total", sum(step_bytes), ",")
square_exact = set(square_sent) == {sum(step_bytes)} and \
    [c["collective"] for c in square_calls] == ["all_gather", "all_gather"] and \
    all(c["world"] == 2 for c in square_calls)
glue("square_exact", square_exact)
glue("square_text", "two all_gathers of 2 ranks each ran, and every rank sent the plan's "
     "bytes" if square_exact else "the trace does not show the plan's two all_gathers of 2 "
     "ranks with its bytes")
say("""
The trace agrees: {glue}`square_text`, {glue}`step1_bytes` bytes in the first step (a
quarter of the tensor is each rank's block; it sends it to the other rank of its Y group) and
{glue}`step2_bytes` in the second (a half: the two blocks its Y group now holds), in all
{glue}`square_total`.
""")

# %% [markdown]
# ## 4. Uneven chunks
#
# A dim of L elements on n ranks is cut as `torch.chunk` cuts it: pieces
# of ceil(L / n), the last ones shorter, and the ones after the end empty.
# It is not numpy's `array_split`, which spreads the remainder over the
# first pieces. A tensor of 5 rows on 4 ranks:

# %%
SHAPE_UNEVEN = (5, 4)
torch_sizes = chunk_sizes(SHAPE_UNEVEN[0], RANKS)
numpy_sizes = [len(part) for part in np.array_split(np.arange(SHAPE_UNEVEN[0]), RANKS)]
print(f"torch.chunk's sizes of 5 on 4: {torch_sizes}; numpy's array_split: {numpy_sizes}")


def uneven_run():
    """On every rank: its piece of a 5 x 4 tensor under S(0), and S(0) -> R traced."""
    mesh = init_device_mesh("cpu", (RANKS,))
    x = distribute_tensor(labelled(SHAPE_UNEVEN), mesh, [Shard(0)], src_data_rank=None)
    the_plan = plan(x, [Replicate()])
    with trace.region("uneven gather"):
        y = x.redistribute(mesh, [Replicate()])
    return (np.array(x.to_local().data), str(the_plan), the_plan.nbytes,
            bool(np.array_equal(y.to_local().data, labelled(SHAPE_UNEVEN))))


uneven_path = OUT / "uneven.jsonl"
uneven = minidist.launch(uneven_run, world_size=RANKS, trace=str(uneven_path), **LAUNCH)
uneven_calls, uneven_sent, _ = replay(trace.read_jsonl(uneven_path).events, "uneven gather",
                                      RANKS)
held_rows = [uneven[rank][0].shape[0] for rank in range(RANKS)]
print(f"rows each rank holds on the real processes: {held_rows}")
console.print(layout_text_view(SHAPE_UNEVEN, (RANKS,), [Shard(0)], color=False))
print(uneven[0][1])
print(f"the trace: {calls_text(uneven_calls)}; bytes sent per rank "
      f"{', '.join(map(str, uneven_sent))}; every rank holds the whole tensor: "
      f"{all(result[3] for result in uneven)}")
uneven_whole = int(np.prod(SHAPE_UNEVEN)) * 8
padded_whole = RANKS * max(torch_sizes) * SHAPE_UNEVEN[1] * 8
print(f"(n-1)/n of the tensor: 3/4 x {uneven_whole} = {3 * uneven_whole / 4:g} B; of the "
      f"padded tensor ({RANKS} pieces of {max(torch_sizes)} rows): 3/4 x {padded_whole} = "
      f"{3 * padded_whole // 4} B")

# %% jupyter={"source_hidden": true}
glue("torch_sizes", ", ".join(map(str, torch_sizes)))
glue("numpy_sizes", ", ".join(map(str, numpy_sizes)))
glue("held_rows", ", ".join(map(str, held_rows)))
glue("held_is_torch", held_rows == torch_sizes)
glue("held_text", "the same as torch.chunk's" if held_rows == torch_sizes else
     "not torch.chunk's")
glue("uneven_planned", uneven[0][2])
glue("padded_bytes", 3 * padded_whole // 4)
glue("unpadded_bytes", 3 * uneven_whole / 4, "g")
padding_exact = set(uneven_sent) == {uneven[0][2]} == {3 * padded_whole // 4}
glue("padding_exact", padding_exact)
glue("padding_text", "exactly (n-1)/n of the padded tensor, as the plan said" if padding_exact
     else "not the padded tensor's (n-1)/n")
glue("padding_share", padded_whole / uneven_whole, ".2f")
say("""
torch.chunk cuts 5 rows into {glue}`torch_sizes`, numpy's array_split into
{glue}`numpy_sizes`; the real processes held {glue}`held_rows` rows, {glue}`held_text`, rank
3 an empty piece of shape (0, 4). The all_gather's pieces must be of one size, so each
travels padded to the largest, 2 rows, and is trimmed on arrival (torch does the same): every
rank sent {glue}`uneven_planned` bytes, {glue}`padding_text`, where the tensor's own (n-1)/n
would be {glue}`unpadded_bytes`. The padded tensor is {glue}`padding_share` times the tensor:
an uneven cut pays for the rows it does not have.

The exercise of this section is the all_to_all of this lesson with uneven
chunks, written by hand: `minidist exercise start redistribute_layout`, then
`minidist exercise check redistribute_layout` runs it on 2 and 4 processes
against `redistribute`.
""")

# %% [markdown]
# ## 5. The backward of a change of layout
#
# A change of layout is a step of the autograd graph like any other, and
# its backward is the opposite change, applied to the gradient: the
# gradient of a tensor has the tensor's layout. A `Shard -> Replicate`
# gathered the pieces, so its backward gives each rank its own piece of
# the gradient back (the gradient of a replicated tensor is taken to be
# replicated: nothing is sent). A `Replicate -> Shard` sent nothing, so its
# backward gathers: every rank's copy needs the whole gradient. The
# gradient of a `Partial` term is the whole gradient (each term counts
# once in the sum), so a `P -> S(0)` has for backward an all_gather. And
# an all_to_all's backward is the all_to_all back.
#
# Each change below takes a leaf x to y = x.redistribute(...) forward, then
# runs the backward of each rank's loss sum(y * G), G a tensor of known
# values in y's layout, each in a trace region:

# %%
BACKWARD_CHANGES = [("S(0) -> R", [Shard(0)], [Replicate()], "take own chunk"),
                    ("R -> S(0)", [Replicate()], [Shard(0)], "all_gather"),
                    ("P -> S(0)", [Partial()], [Shard(0)], "all_gather"),
                    ("S(0) -> S(1)", [Shard(0)], [Shard(1)], "all_to_all")]
SHAPE_BACKWARD = (8, 12)


def forward_and_backward():
    """On every rank: each change forward and backward in trace regions; the
    gradient each leaf received and the one expected."""
    mesh = init_device_mesh("cpu", (RANKS,))
    whole = labelled(SHAPE_BACKWARD)
    gradient = 1.0 + labelled(SHAPE_BACKWARD) / 100
    found = []
    for name, source, target, _ in BACKWARD_CHANGES:
        x = distribute_tensor(Tensor(whole, requires_grad=True), mesh, source,
                              src_data_rank=None)
        with trace.region(f"forward {name}"):
            y = x.redistribute(mesh, target)
        # G's piece in y's layout: each rank's loss is sum(y * G) over what it holds
        g = distribute_tensor(gradient, mesh, target, src_data_rank=None).to_local().data
        loss = (y.to_local() * Tensor(g)).sum()
        with trace.region(f"backward {name}"):
            loss.backward()
        # the gradient x should get: G in x's layout (a Partial's: G whole, each term's)
        grad_layout = [Replicate() if isinstance(p, Partial) else p for p in source]
        want = distribute_tensor(gradient, mesh, grad_layout, src_data_rank=None).to_local().data
        opposite = plan(y, grad_layout)
        found.append((bool(np.allclose(x.grad, want)), opposite.nbytes,
                      opposite.collectives))
    return found


backward_path = OUT / "backward.jsonl"
backward = minidist.launch(forward_and_backward, world_size=RANKS, trace=str(backward_path),
                           **LAUNCH)
backward_events = trace.read_jsonl(backward_path).events
rows, backward_right, backward_exact = [], True, True
for index, (name, _, _, expected) in enumerate(BACKWARD_CHANGES):
    forward_calls, forward_sent, _ = replay(backward_events, f"forward {name}", RANKS)
    back_calls, back_sent, _ = replay(backward_events, f"backward {name}", RANKS)
    right = all(result[index][0] for result in backward)
    opposite_bytes, opposite_collectives = backward[0][index][1], backward[0][index][2]
    ran = back_calls[0]["collective"] if back_calls else "nothing sent"
    backward_right &= right
    backward_exact &= set(back_sent) == {opposite_bytes} and \
        (ran == expected or (not back_calls and expected == "take own chunk"))
    rows.append((name, forward_calls[0]["collective"] if forward_calls else "nothing sent",
                 max(forward_sent), ran, max(back_sent), expected, opposite_bytes,
                 "yes" if right else "NO"))
print(table(rows, ("change", "forward (trace)", "B", "backward (trace)", "B",
                   "the table's backward", "its plan B", "gradient right")))

# %% jupyter={"source_hidden": true}
glue("backward_right", backward_right)
glue("backward_right_text", "every leaf got the gradient G in its own layout (its piece of "
     "G, or for a Partial's term the whole of G)" if backward_right else
     "some leaf did not get G in its own layout")
glue("backward_exact", backward_exact)
glue("backward_exact_text", "the collective the trace shows in each backward is the one the "
     "table names, and its bytes per rank are the opposite change's plan" if backward_exact
     else "the trace's backward does not always match the table's opposite change")
glue("gather_back_bytes", backward[0][1][1], ",")
say("""
{glue}`backward_exact_text`; and {glue}`backward_right_text`. The cheapest forward,
`R -> S(0)`, which sent nothing, has the dearest backward, an all_gather of
{glue}`gather_back_bytes` bytes per rank, and the all_gather of `S(0) -> R` has a backward
that sends nothing: a change of layout moves its cost between the forward and the backward,
it does not remove it. Lesson 17's pair of Megatron's f and g make the same trade: f an
identity forward and an all_reduce backward, g the reverse.
""")

# %% [markdown]
# ## 6. Megatron's MLP as placements
#
# Lesson 10 split an MLP by hand: the first weight by its columns, the
# second by its rows, and one all_reduce at the end (Shoeybi et al.,
# "Megatron-LM", 2019). In layouts the same MLP is four lines, and the ops'
# rules say where the one message goes. The input x (tokens x d) is
# `Replicate()`; the first weight, in the (in, out) view that x @ W1
# multiplies, is `Shard(1)`: each rank holds some of its columns. torch
# stores a Linear's weight as (out, in) and computes x @ weight.T, so the
# same cut is `Shard(0)` of torch's weight: a `ColwiseParallel` weight is
# `Shard(0)`. The product x @ W1 is then `Shard(1)`, each rank its columns
# of the hidden layer; GELU acts on each element alone, so it keeps the
# layout (`Shard(-1)`, the last dim: `S(1)` for this h of 2 dims). The
# second weight, (in, out), is
# `Shard(0)`, its rows cut as the hidden columns are (torch's (out, in)
# weight: `Shard(1)`, a `RowwiseParallel` weight), and a `Shard(1)` times
# a `Shard(0)` gives each rank one term of the product: `Partial()`. No
# message has run yet; the all_reduce appears when the Partial is made
# `Replicate()`.
#
# Below, the MLP without biases on 4 processes, each op in a trace region
# of its own: the layout every intermediate has, as the lesson prints it
# on rank 0 (its global shape, its placements, the piece rank 0 holds),
# and the collectives the trace shows in each region.

# %%
D_MODEL, D_HIDDEN, TOKENS = 8, 16, 6


def mlp_arrays():
    """x (tokens x d) and the two weights in the (in, out) view, float64."""
    rng = np.random.default_rng(21)
    return (rng.standard_normal((TOKENS, D_MODEL)),
            rng.standard_normal((D_MODEL, D_HIDDEN)) / np.sqrt(D_MODEL),
            rng.standard_normal((D_HIDDEN, D_MODEL)) / np.sqrt(D_HIDDEN))


MLP_STEPS = ["x", "W1", "W2", "h = x @ W1", "GELU(h)", "y = GELU(h) @ W2", "y as R"]


def mlp_by_placements():
    """On every rank: Megatron's MLP written as layouts, each op in a trace region;
    (step, global shape, placements, local shape) of every tensor, and the result."""
    from minidist.nn import functional as F

    mesh = init_device_mesh("cpu", (RANKS,))
    x, w1, w2 = mlp_arrays()
    xd = distribute_tensor(Tensor(x), mesh, [Replicate()])
    W1 = distribute_tensor(Tensor(w1), mesh, [Shard(1)])
    W2 = distribute_tensor(Tensor(w2), mesh, [Shard(0)])
    with trace.region("h = x @ W1"):
        h = xd @ W1
    with trace.region("GELU(h)"):
        gelu = F.gelu(h)
    with trace.region("y = GELU(h) @ W2"):
        y = gelu @ W2
    the_plan = plan(y, [Replicate()])
    with trace.region("y as R"):
        z = y.redistribute(mesh, [Replicate()])
    tensors = [xd, W1, W2, h, gelu, y, z]
    return ([(step, tuple(t.shape), "(" + ", ".join(map(str, t.placements)) + ")",
              tuple(t.to_local().data.shape)) for step, t in zip(MLP_STEPS, tensors)],
            np.array(z.to_local().data), str(the_plan))


placed_path = OUT / "mlp_placements.jsonl"
placed = minidist.launch(mlp_by_placements, world_size=RANKS, trace=str(placed_path), **LAUNCH)
placed_events = trace.read_jsonl(placed_path).events
x_mlp, w1_mlp, w2_mlp = mlp_arrays()
from minidist.nn import functional as F  # noqa: E402

one_process_y = (F.gelu(Tensor(x_mlp) @ Tensor(w1_mlp)) @ Tensor(w2_mlp)).data
rows, placed_calls = [], {}
for step, shape, placements, local_shape in placed[0][0]:
    if step in ("x", "W1", "W2"):
        ran = "(given)"
    else:
        calls, _, _ = replay(placed_events, step, RANKS)
        placed_calls[step] = [c["collective"] for c in calls]
        ran = calls_text(calls)
    rows.append((step, shape, placements, local_shape, ran))
print(table(rows, ("tensor", "global shape", "layout", "rank 0 holds", "collectives (trace)")))
print(placed[0][2])
placed_error = max(float(np.abs(result[1] - one_process_y).max()) for result in placed)
print(f"largest difference of any rank's y from one process's: {placed_error:.1e}")

# %% jupyter={"source_hidden": true}
layouts_of = {step: placements for step, _, placements, _ in placed[0][0]}
glue("h_layout", layouts_of["h = x @ W1"])
glue("gelu_layout", layouts_of["GELU(h)"])
glue("y_layout", layouts_of["y = GELU(h) @ W2"])
glue("z_layout", layouts_of["y as R"])
quiet_until_reduce = all(placed_calls[s] == [] for s in ("h = x @ W1", "GELU(h)",
                                                         "y = GELU(h) @ W2"))
glue("quiet_until_reduce", quiet_until_reduce)
glue("quiet_text", "no collective ran in the three ops" if quiet_until_reduce else
     "a collective ran before the reduction")
glue("reduce_calls", ", ".join(placed_calls["y as R"]) or "nothing")
glue("placed_error", placed_error, ".1e")
glue("hidden_piece", placed[0][0][3][3][1])
glue("d_hidden", D_HIDDEN)
say("""
The rules gave what Megatron's split is: x @ W1 came out {glue}`h_layout`, each rank
{glue}`hidden_piece` of the {glue}`d_hidden` hidden columns; GELU kept {glue}`gelu_layout`; the product with
W2 came out {glue}`y_layout`. In the trace {glue}`quiet_text`; the one message is the
{glue}`reduce_calls` of the last line, the change `P(sum) -> R` (its plan printed above), and
afterwards y is {glue}`z_layout`, within {glue}`placed_error` of one process's y on every rank.
""")

# %% [markdown]
# The same MLP, with its biases, three ways on 4 processes: one process
# (the reference), torch's styles (`parallelize_module(mlp, mesh, {"fc1":
# ColwiseParallel(), "fc2": RowwiseParallel()})`, which turns the two
# Linear layers' weights into DTensor parameters of the layouts above and
# the activations into DTensors between them), and the split layers of
# lesson 10 written by hand (`ColumnParallelLinear`, `RowParallelLinear`,
# with Megatron's f and g). Each rank computes a forward and the backward
# of sum(y * G) (G known values, as in section 5), each in a trace
# region; every rank's output and every
# rank's piece of each gradient is compared with one process's.

# %%
class MLP(minidist.nn.Module):
    """Linear(d, 16), GELU, Linear(16, d), float64, the same weights every time."""

    def __init__(self):
        super().__init__()
        self.fc1 = minidist.nn.Linear(D_MODEL, D_HIDDEN, rng=1, dtype=np.float64)
        self.fc2 = minidist.nn.Linear(D_HIDDEN, D_MODEL, rng=2, dtype=np.float64)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def mlp_batch():
    rng = np.random.default_rng(22)
    return rng.standard_normal((2, 3, D_MODEL)), rng.standard_normal((2, 3, D_MODEL))


def forward_backward(model, name):
    """A forward and the backward of sum(y * G), each in a trace region: y, the
    gradient of every parameter (this rank's piece of it) and of the input."""
    x, g = mlp_batch()
    x = Tensor(x, requires_grad=True)
    with trace.region(f"{name} forward"):
        y = model(x)
    with trace.region(f"{name} backward"):
        (y * Tensor(g)).sum().backward()
    grads = {n: np.array(p.grad) for n, p in model.named_parameters()}
    grads["input"] = np.array(x.grad)
    return np.array(y.data), grads


def mlp_three_ways():
    """On every rank: the MLP by torch's styles and by the split layers; their
    outputs, gradients, and the box of every whole parameter each piece is."""
    from minidist.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from minidist.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    mesh = init_device_mesh("cpu", (RANKS,))
    styled = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(),
                                              "fc2": RowwiseParallel()})
    layouts = {n: "(" + ", ".join(map(str, p.placements)) + ")"
               for n, p in styled.named_parameters()}
    boxes = {n: p._spec.local_shape_and_offset() for n, p in styled.named_parameters()}
    styles = forward_backward(styled, "styles")
    split = MLP()
    split.fc1 = ColumnParallelLinear.from_linear(split.fc1)
    split.fc2 = RowParallelLinear.from_linear(split.fc2)
    cuts = {"input": (slice(None),), "fc1.weight": (split.fc1.shard, slice(None)),
            "fc1.bias": (split.fc1.shard,),
            "fc2.weight": (slice(None), split.fc2.shard), "fc2.bias": (slice(None),)}
    return layouts, boxes, styles, forward_backward(split, "split"), cuts


three_path = OUT / "mlp_three_ways.jsonl"
three = minidist.launch(mlp_three_ways, world_size=RANKS, trace=str(three_path), **LAUNCH)
three_events = trace.read_jsonl(three_path).events
whole_mlp = MLP()
x_batch, g_batch = mlp_batch()
x_whole = Tensor(x_batch, requires_grad=True)
whole_y = whole_mlp(x_whole)
(whole_y * Tensor(g_batch)).sum().backward()
whole_grads = {n: p.grad for n, p in whole_mlp.named_parameters()}
whole_grads["input"] = x_whole.grad
errors = {"styles": [0.0, 0.0], "split": [0.0, 0.0]}
for _layouts, boxes, styles, split, cuts in three:
    for way, (y, grads) in (("styles", styles), ("split", split)):
        errors[way][0] = max(errors[way][0], float(np.abs(y - whole_y.data).max()))
        for n, grad in grads.items():
            if way == "styles" and n in boxes:
                shape, offset = boxes[n]
                piece = whole_grads[n][tuple(slice(o, o + s) for o, s in zip(offset, shape))]
            else:
                piece = whole_grads[n][cuts[n]]
            errors[way][1] = max(errors[way][1], float(np.abs(grad - piece).max()))
print("torch's styles made the parameters DTensors of these layouts (torch's (out, in) "
      "weights):")
whole_shapes = {n: tuple(p.shape) for n, p in whole_mlp.named_parameters()}
print(table([(n, whole_shapes[n], layout, tuple(three[0][2][1][n].shape))
             for n, layout in three[0][0].items()],
            ("parameter", "whole shape", "layout", "rank 0's piece")))
messages = {}
rows = []
for way in ("styles", "split"):
    for part in ("forward", "backward"):
        calls, sent, _ = replay(three_events, f"{way} {part}", RANKS)
        messages[way, part] = [c["collective"] for c in calls]
        messages[way, part, "bytes"] = sent
        rows.append((way, part, calls_text(calls), max(sent)))
print(table(rows, ("way", "pass", "collectives (trace, rank 0)", "bytes sent per rank")))
print(table([(way, f"{errors[way][0]:.1e}", f"{errors[way][1]:.1e}") for way in errors],
            ("way", "largest output difference", "largest gradient difference")))

# %% jupyter={"source_hidden": true}
glue("fc1_layout", three[0][0]["fc1.weight"])
glue("fc2_layout", three[0][0]["fc2.weight"])
same_messages = all(messages["styles", part] == messages["split", part] and
                    messages["styles", part, "bytes"] == messages["split", part, "bytes"]
                    for part in ("forward", "backward"))
glue("same_messages", same_messages)
glue("messages_text", "the same collectives in each pass, every rank the same bytes"
     if same_messages else "different collectives or bytes")
glue("forward_calls", ", ".join(messages["styles", "forward"]) or "nothing")
glue("backward_calls", ", ".join(messages["styles", "backward"]) or "nothing")
worst_output = max(errors["styles"][0], errors["split"][0])
worst_grad = max(errors["styles"][1], errors["split"][1])
glue("worst_output", worst_output, ".1e")
glue("worst_grad", worst_grad, ".1e")
glue("three_agree", max(worst_output, worst_grad) < 1e-12)
say("""
torch's styles gave fc1's weight {glue}`fc1_layout` and fc2's {glue}`fc2_layout` of torch's
(out, in) weights, the `S(1)` and `S(0)` of the (in, out) view above. Both ways sent
{glue}`messages_text`: a forward of one {glue}`forward_calls` (the Partial made
Replicate after fc2, Megatron's g) and a backward of one {glue}`backward_calls` (the input's
gradient, a sum of every rank's columns' share, Megatron's f). The outputs differ from one
process's by at most {glue}`worst_output` and every rank's piece of every gradient by at most
{glue}`worst_grad`: the styles are the split layers with their layouts named, and the
collectives are the ones the layouts' changes call for.
""")

# %% [markdown]
# ## 7. FSDP2 against FSDP1
#
# Lesson 12's fully sharded data parallel, torch's
# `FullyShardedDataParallel` (Zhao et al., "PyTorch FSDP", 2023), here
# FSDP1, lays each unit's parameters end to end in one **flat** buffer,
# pads it with zeros to a multiple of n, and gives each rank one slice of
# it: a slice that cuts across parameters, with no layout a DTensor could
# name. torch's newer `fully_shard` (FSDP2) keeps every parameter a
# tensor of its own and makes it a `Shard(0)` DTensor on the data-parallel
# mesh: each rank holds torch.chunk's rows of every weight, and the layout
# says so. Both run the same messages per unit (a group of layers gathered
# and freed together): an all_gather of the unit's weights before its
# forward (and again before its backward), a reduce_scatter of its
# gradients after its backward; FSDP2's unit is what `fully_shard` was
# applied to, here each Linear.
#
# A small MLP (Linear(5, 7), Tanh, Linear(7, 5), Tanh, Linear(5, 3),
# float64) trains 2 steps of Adam on 4 processes, each rank
# 2 rows of a batch of 8, under FSDP1 (FULL_SHARD) and under FSDP2, with
# the trace on. After the second step each rank's memory ledger
# (`minidist/memory.py`'s `Ledger`, lesson 12) counts what it holds:

# %%
from minidist import memory, optim  # noqa: E402
from minidist.parallel import FullyShardedDataParallel  # noqa: E402
from minidist.parallel.placements import fully_shard  # noqa: E402
from viz.timeline import draw_timeline  # noqa: E402

FSDP_STEPS, FSDP_ROWS = 2, 2     # steps of Adam; rows of the batch per rank


def fsdp_mlp():
    minidist.nn.init.manual_seed(0)
    nn_ = minidist.nn
    return nn_.Sequential(nn_.Linear(5, 7), nn_.Tanh(), nn_.Linear(7, 5), nn_.Tanh(),
                          nn_.Linear(5, 3)).to(np.float64)


def fsdp_batch(step):
    rng = np.random.default_rng(30 + step)
    return rng.standard_normal((RANKS * FSDP_ROWS, 5)), rng.integers(0, 3, RANKS * FSDP_ROWS)


def train_sharded(kind):
    """On every rank: FSDP_STEPS steps of Adam under FSDP1 or FSDP2, each step a
    trace region; the ledger after the last step, the whole weights, and the layout
    and local shape of every parameter FSDP2 made."""
    rank = minidist.distributed.get_rank()
    if kind == "FSDP1":
        model = FullyShardedDataParallel(fsdp_mlp(), sharding_strategy="FULL_SHARD")
    else:
        model = fsdp_mlp()
        for index in (0, 2, 4):
            fully_shard(model[index])
        fully_shard(model)
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    mine = slice(rank * FSDP_ROWS, (rank + 1) * FSDP_ROWS)
    for step in range(FSDP_STEPS):
        x, y = fsdp_batch(step)
        with trace.region(f"{kind} step {step}"):
            optimizer.zero_grad()
            minidist.nn.CrossEntropyLoss()(model(Tensor(x[mine])), y[mine]).backward()
            optimizer.step()
    held = memory.Ledger(model, optimizer).measure()
    if kind == "FSDP1":
        return held, [np.array(w) for w in model.full_weights()], {}
    shapes = {n: (str(p.placements[0]), tuple(p.to_local().data.shape))
              for n, p in model.named_parameters()}
    return held, [p.full_tensor().numpy() for p in model.parameters()], shapes


def one_process_mlp():
    model = fsdp_mlp()
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    for step in range(FSDP_STEPS):
        x, y = fsdp_batch(step)
        optimizer.zero_grad()
        minidist.nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
        optimizer.step()
    return [p.data.copy() for p in model.parameters()], {n: tuple(p.shape) for n, p in
                                                         model.named_parameters()}


sharded, fsdp_events = {}, {}
for kind in ("FSDP1", "FSDP2"):
    path = OUT / f"{kind.lower()}.jsonl"
    sharded[kind] = minidist.launch(train_sharded, world_size=RANKS, args=(kind,),
                                    trace=str(path), **LAUNCH)
    fsdp_events[kind] = trace.read_jsonl(path).events
reference_weights, whole_shapes_mlp = one_process_mlp()
model_elements = sum(int(np.prod(s)) for s in whole_shapes_mlp.values())
print("FSDP2's parameters (each rank's piece, torch.chunk's rows):")
print(table([(n, whole_shapes_mlp[n], sharded["FSDP2"][0][2][n][0],
              *(sharded["FSDP2"][r][2][n][1] for r in range(RANKS)))
             for n in whole_shapes_mlp],
            ("parameter", "whole", "layout", *(f"rank {r}" for r in range(RANKS)))))
rows = []
for kind in ("FSDP1", "FSDP2"):
    for rank in range(RANKS):
        held = sharded[kind][rank][0]
        rows.append((kind, rank, held["parameters"], held["gradients"], held["optimizer_state"],
                     held["parameters"] + held["gradients"] + held["optimizer_state"]))
print("\nthe ledger after the last step, bytes per rank:")
print(table(rows, ("", "rank", "parameters", "gradients", "optimizer state", "in all")))
#: FSDP1 pads each unit (each Linear: its weight and bias, flat) to a multiple of n
unit_elements = [7 * 5 + 7, 5 * 7 + 5, 3 * 5 + 3]
fsdp1_padding = sum(-(-u // RANKS) * RANKS - u for u in unit_elements)
#: FSDP2 pads each parameter's rows to a multiple of n, in its messages only
fsdp2_padding = sum(-(-s[0] // RANKS) * RANKS * int(np.prod(s[1:])) - int(np.prod(s))
                    for s in whole_shapes_mlp.values())
fsdp1_params = [sharded["FSDP1"][r][0]["parameters"] for r in range(RANKS)]
fsdp2_params = [sharded["FSDP2"][r][0]["parameters"] for r in range(RANKS)]
print(f"parameters over the 4 ranks: FSDP1 {sum(fsdp1_params)} B, FSDP2 {sum(fsdp2_params)} B; "
      f"the model: {model_elements * 8} B")
print(f"zeros of padding: FSDP1 {fsdp1_padding} elements, in its shards (each unit's flat "
      f"buffer to a multiple of {RANKS}); FSDP2 {fsdp2_padding} elements, in its all_gather "
      f"and reduce_scatter buffers only (each parameter's rows to a multiple of {RANKS})")
weight_error = {kind: max(float(np.abs(got - want).max())
                          for r in sharded[kind]
                          for got, want in zip(r[1], reference_weights, strict=True))
                for kind in sharded}
print(f"largest difference of the whole weights after {FSDP_STEPS} steps from one process's: "
      + ", ".join(f"{kind} {error:.1e}" for kind, error in weight_error.items()))

# %% jupyter={"source_hidden": true}
glue("model_bytes", model_elements * 8)
glue("fsdp1_per_rank", ", ".join(map(str, fsdp1_params)))
glue("fsdp2_per_rank", ", ".join(map(str, fsdp2_params)))
glue("fsdp1_sum", sum(fsdp1_params))
glue("fsdp2_sum", sum(fsdp2_params))
glue("fsdp1_padding", fsdp1_padding)
glue("fsdp1_padding_bytes", fsdp1_padding * 8)
glue("fsdp2_padding", fsdp2_padding)
glue("fsdp2_sums_to_model", sum(fsdp2_params) == model_elements * 8)
glue("fsdp1_pads_exactly", sum(fsdp1_params) == (model_elements + fsdp1_padding) * 8)
glue("fsdp1_equal_slices", len(set(fsdp1_params)) == 1)
glue("fsdp2_last_least", fsdp2_params[-1] == min(fsdp2_params) < max(fsdp2_params))
glue("grads_equal_params", all(r[0]["gradients"] == r[0]["parameters"]
                               for kind in sharded for r in sharded[kind]))
glue("moments_twice", all(r[0]["optimizer_state"] == 2 * r[0]["parameters"]
                          for kind in sharded for r in sharded[kind]))
glue("fsdp_weight_error", max(weight_error.values()), ".1e")
glue("fsdp_equal", max(weight_error.values()) < 1e-12)
say("""
FSDP1's ranks hold {glue}`fsdp1_per_rank` bytes of parameters: equal slices, which add up to
{glue}`fsdp1_sum`, the model's {glue}`model_bytes` and {glue}`fsdp1_padding` zeros of padding
({glue}`fsdp1_padding_bytes` bytes). FSDP2's ranks hold {glue}`fsdp2_per_rank`: torch.chunk's
rows of each weight, so the last rank, given 1 row of the first weight and none of the two
others, holds the least; their sum is {glue}`fsdp2_sum`, the model exactly, no padding kept.
FSDP2 pads too ({glue}`fsdp2_padding` elements), but only in the buffers of its collectives,
which need pieces of one size. The gradients take the parameters' bytes and Adam's two
moments twice them, under both. After the two steps the whole weights of both equal one
process's, the largest difference {glue}`fsdp_weight_error`.
""")

# %% [markdown]
# The second step of FSDP2 on the timeline (`viz/timeline.py`), one row
# per rank: the compute lane holds the root's forward ("fully_shard
# forward Sequential", around the whole forward, each Linear's forward
# inside it) and each unit's work after its backward ("fully_shard
# post-backward Linear", where its reduce_scatter runs); the calls lane
# above it the collectives, the send and recv lanes below it the messages.
# Each call's label names its algorithm: FSDP's all_gathers here run
# recursive doubling and its reduce_scatters recursive halving (lesson 2),
# in which each rank sends the same (n - 1) pieces as in the ring. The trace is
# read for three things:
# an all_gather before each unit's forward, a reduce_scatter after each
# unit's backward, and the **prefetch**: from the second step on, the
# next unit's all_gather is issued when the previous unit's forward
# starts, so that it runs while that forward computes (on a GPU the two
# overlap; here it shows as a gather that starts inside the previous
# forward's region).

# %%
def step_events(events, label):
    region = {e["rank"]: e for e in events if e["kind"] == "compute" and e["label"] == label}
    return [e for e in events if e["rank"] in region and region[e["rank"]]["start"] <= e["start"]
            and e["end"] <= region[e["rank"]]["end"] and e is not region[e["rank"]]]


def e_is(event, collective):
    return event["kind"] == "collective" and \
        trace.label_info(event["label"]).get("collective") == collective


counts, prefetched = {}, {}
for kind in ("FSDP1", "FSDP2"):
    shown_events = step_events(fsdp_events[kind], f"{kind} step {FSDP_STEPS - 1}")
    mine0 = [e for e in shown_events if e["rank"] == 0]
    calls = [trace.label_info(e["label"]).get("collective") for e in mine0
             if e["kind"] == "collective"]
    counts[kind] = {name: calls.count(name) for name in ("all_gather", "reduce_scatter",
                                                         "all_reduce")}
    sends = [e for e in mine0 if e["kind"] == "send" and e["peer"] != 0]
    counts[kind]["bytes"] = sum(e["bytes"] for e in sends if not e["label"].startswith(
        "all_reduce"))
    counts[kind]["other"] = sum(e["bytes"] for e in sends if e["label"].startswith("all_reduce"))
    if kind == "FSDP2":
        step2_events = shown_events
        forwards = [e for e in mine0 if e["kind"] == "compute"
                    and trace.label_text(e["label"]).startswith("fully_shard forward Linear")]
        gathers = [e for e in mine0 if e["kind"] == "collective"
                   and trace.label_info(e["label"]).get("collective") == "all_gather"]
        prefetched = sum(any(f["start"] <= g["start"] < f["end"] for f in forwards)
                         for g in gathers)
        # each unit's forward starts after its weights' all_gather ended (the first three
        # gathers of the step, in order); each reduce_scatter runs inside a post-backward
        forwards.sort(key=lambda e: e["start"])
        gathers.sort(key=lambda e: e["start"])
        gathered_first = len(forwards) == 3 and all(
            g["end"] <= f["start"] for g, f in zip(gathers, forwards))
        post = [e for e in mine0 if e["kind"] == "compute"
                and trace.label_text(e["label"]).startswith("fully_shard post-backward")]
        reduces_after = [any(p["start"] <= r["start"] and r["end"] <= p["end"] for p in post)
                         for r in mine0 if e_is(r, "reduce_scatter")]
#: each rank's piece of each unit in the collectives' buffers: FSDP1 a slice of the unit's
#: padded flat buffer, FSDP2 every parameter's rows padded to a multiple of n
piece = {"FSDP1": sum(-(-u // RANKS) for u in unit_elements),
         "FSDP2": sum(-(-s[0] // RANKS) * int(np.prod(s[1:])) for s in whole_shapes_mlp.values())}
#: 3 collectives of each unit per step (2 all_gathers, 1 reduce_scatter), each sending
#: (n-1) pieces of 8 bytes: the bytes per rank per step
step_formula = {kind: 3 * (RANKS - 1) * piece[kind] * 8 for kind in piece}
print(table([(kind, c["all_gather"], c["reduce_scatter"], c["bytes"], step_formula[kind],
              c["all_reduce"], c["other"]) for kind, c in counts.items()],
            ("step 2, rank 0", "all_gathers", "reduce_scatters", "their bytes sent",
             "3 (n-1) x piece x 8", "all_reduces", "their bytes")))
print(f"FSDP2, rank 0: each unit's forward started after its all_gather ended: "
      f"{gathered_first}; reduce_scatters inside a unit's post-backward: "
      f"{sum(reduces_after)} of {len(reduces_after)}; all_gathers issued inside a previous "
      f"unit's forward (prefetched): {prefetched}")
show_figure(draw_timeline([e for e in step2_events if e["kind"] != "step"], max_steps=None,
                          title="FSDP2, the second step: 4 ranks, a unit per Linear"),
            "fsdp2_timeline.png", "FSDP2's second step: each unit's all_gather, forward, "
            "backward and reduce_scatter, per rank", dpi=90)

# %% jupyter={"source_hidden": true}
glue("fsdp2_gathers", counts["FSDP2"]["all_gather"])
glue("fsdp2_reduces", counts["FSDP2"]["reduce_scatter"])
glue("fsdp1_gathers", counts["FSDP1"]["all_gather"])
glue("fsdp1_reduces", counts["FSDP1"]["reduce_scatter"])
glue("prefetched", prefetched)
glue("gathered_first", gathered_first)
glue("reduces_after", all(reduces_after) and len(reduces_after) == 3)
glue("order_text", "each unit's forward began after its all_gather had ended, and each "
     "reduce_scatter ran inside a unit's post-backward" if gathered_first and all(reduces_after)
     else "the trace does not show every gather before its forward and every reduce_scatter "
     "after its backward")
glue("fsdp1_step_bytes", counts["FSDP1"]["bytes"])
glue("fsdp2_step_bytes", counts["FSDP2"]["bytes"])
glue("fsdp1_piece", piece["FSDP1"])
glue("fsdp2_piece", piece["FSDP2"])
glue("fsdp_bytes_formula", all(counts[k]["bytes"] == step_formula[k] for k in counts))
glue("fsdp_formula_text", "the formula's to the byte" if all(
    counts[k]["bytes"] == step_formula[k] for k in counts) else "not the formula's")
glue("fsdp1_all_reduces", counts["FSDP1"]["all_reduce"])
glue("fsdp2_all_reduces", counts["FSDP2"]["all_reduce"])
glue("fsdp1_count_bytes", counts["FSDP1"]["other"])
say("""
In the second step rank 0 ran {glue}`fsdp2_gathers` all_gathers and {glue}`fsdp2_reduces`
reduce_scatters under FSDP2 (each of the 3 units gathered before its forward and again before
its backward, and reduce-scattered its gradients once), and {glue}`fsdp1_gathers` and
{glue}`fsdp1_reduces` under FSDP1: the same messages per unit. On FSDP2's trace
{glue}`order_text`. {glue}`prefetched` of FSDP2's
gathers started inside the previous unit's forward: the second and the third unit's weights
were on their way while the unit before them computed.

The bytes differ with the padding. Each collective sends (n - 1) pieces of a unit, a piece
being what one rank holds of it in the collective's buffer: under FSDP1 its slice of the
padded flat buffer, {glue}`fsdp1_piece` values for the three units together; under FSDP2
each parameter's rows padded to a multiple of n, {glue}`fsdp2_piece` values. Three
collectives a unit make 3 (n - 1) pieces of 8-byte values per step (the table's formula
column): {glue}`fsdp1_step_bytes` bytes sent by rank
0 under FSDP1 and {glue}`fsdp2_step_bytes` under FSDP2, {glue}`fsdp_formula_text`. On a model
this small, whose weights have 3 to 7 rows, a row of padding per parameter is much; on a real
one's thousands of rows it is not. FSDP1 ran {glue}`fsdp1_all_reduces` all_reduce more
({glue}`fsdp1_count_bytes` bytes): the number of examples over all ranks, by which it weighs
each rank's gradient; FSDP2 ran {glue}`fsdp2_all_reduces`, since it averages the ranks'
gradients, each rank's loss the mean over an equal share of the batch (torch's too).
""")

# %% [markdown]
# ## 8. A checkpoint saved on one mesh, loaded on another
#
# A layout says which box of each tensor a rank holds, so a checkpoint
# that records each saved box by its offsets and sizes can be loaded into
# any other layout: each new rank reads, of the saved boxes, the parts
# that meet its own. That is torch's distributed checkpoint
# (`torch.distributed.checkpoint`, here `minidist.distributed.checkpoint`,
# imported as `dcp`): `dcp.save(state_dict, checkpoint_id=folder)` has every
# rank write its own boxes (a box that several ranks hold, replicated, is
# written once, by the lowest of them) and rank 0 a table of them,
# `.metadata`; `dcp.load` reads into whatever layout the target's tensors
# have, and returns a report of what this rank read.
#
# A small GPT (float64) is laid out on 4 processes as a 2 x 2 mesh of
# data parallel ("dp") by tensor parallel ("tp"): `parallelize_module` on
# the tp sub-mesh (`mesh["tp"]`, each rank's group of 2 along tp) with
# torch's styles, the embedding `RowwiseParallel` (its table cut by rows,
# `S(0)`, lm_head tied to it), each block's `mlp.c_fc` `ColwiseParallel`
# and its `mlp.c_proj` and `attn.c_proj` `RowwiseParallel`. (The attention's
# fused c_attn is left whole here: its tensor-parallel form is a split
# layer of packed rows, lesson 17, not a DTensor.) Along dp the two halves
# of the mesh hold the same pieces. It is saved, then loaded in new
# processes into two other layouts: tp4 (the same plan on a mesh of 4) and
# dp4, every parameter `Shard(0)` on 4 ranks (FSDP2's layout, section 7).
# The models loaded into start from other random weights, so that a load
# that missed a piece would show.

# %%
import minidist.distributed.checkpoint as dcp  # noqa: E402
from minidist.distributed.checkpoint import Metadata  # noqa: E402
from minidist.distributed.checkpoint.state_dict import (  # noqa: E402
    get_model_state_dict,
    set_model_state_dict,
)
from minidist.models.gpt import GPT, GPTConfig  # noqa: E402
from viz.checkpoint_reads import layout_boxes, reads_figure, reads_of, reads_table  # noqa: E402

CKPT_CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
CKPT_PATH = str(OUT / "gpt_dp2xtp2")
#: the weight whose reads are drawn: saved S(1) on tp, loaded S(0) on dp4
DRAWN = "model.transformer.h.0.mlp.c_proj.weight"


def tp_plan():
    from minidist.parallel import ColwiseParallel, RowwiseParallel

    return {"transformer.wte": RowwiseParallel(),
            "transformer.h.*.attn.c_proj": RowwiseParallel(),
            "transformer.h.*.mlp.c_fc": ColwiseParallel(),
            "transformer.h.*.mlp.c_proj": RowwiseParallel()}


def gpt_in(layout, seed):
    """A GPT (weights of ``seed``) laid out as ``layout``: "dp2 x tp2", "tp4" or "dp4"."""
    from minidist.distributed.tensor import DTensor
    from minidist.parallel import parallelize_module

    model = GPT(CKPT_CONFIG, rng=seed, dtype=np.float64)
    if layout == "dp4":
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
        for name, param in list(model.named_parameters()):
            *path, attr = name.split(".")
            owner = model
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, attr, minidist.nn.Parameter(
                distribute_tensor(param.data, mesh, [Shard(0)])))
    else:
        shape = (2, 2) if layout == "dp2 x tp2" else (4,)
        names = ("dp", "tp") if layout == "dp2 x tp2" else ("tp",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        parallelize_module(model, mesh["tp"], tp_plan())
    model.lm_head.weight = model.transformer.wte.weight          # tied, as GPT ties them
    layouts = {n: ("(" + ", ".join(map(str, p.placements)) + ")"
                   if isinstance(p, DTensor) else "plain, whole")
               for n, p in model.named_parameters()}
    return model, layouts


def box_of_param(full, param):
    """The box of ``full`` a parameter holds (a plain one: all of it)."""
    if not hasattr(param, "_spec"):
        return full
    sizes, offsets = param._spec.local_shape_and_offset()
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


def save_checkpoint():
    """On every rank: the GPT of seed 0 in dp2 x tp2, saved; its layouts and the
    saved chunks' table (rank 0's)."""
    model, layouts = gpt_in("dp2 x tp2", seed=0)
    metadata = dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=CKPT_PATH)
    return layouts, metadata.total_bytes()


def load_checkpoint(layout):
    """On every rank: a GPT of seed 5 in ``layout``, loaded from the checkpoint;
    whether every local piece equals the saved model's box of it bit for bit, and
    what the load report says."""
    model, layouts = gpt_in(layout, seed=5)
    state = {"model": get_model_state_dict(model)}
    report = dcp.load(state, checkpoint_id=CKPT_PATH)
    set_model_state_dict(model, state["model"])
    saved = GPT(CKPT_CONFIG, rng=0, dtype=np.float64).state_dict()
    bad = [n for n, p in model.named_parameters()
           if not np.array_equal(np.asarray(p.data), box_of_param(np.asarray(saved[n]), p))]
    drawn_reads = sorted((c[0], tuple(c[2]), tuple(c[3])) for c in report.reads[DRAWN])
    return dict(bad=bad, layouts=layouts, text=report.text(), drawn=report.text(DRAWN),
                drawn_reads=drawn_reads,
                bytes_read=report.bytes_read, bytes_saved=report.bytes_saved,
                chunks_read=report.chunks_read, chunks_saved=report.chunks_saved)


saved = minidist.launch(save_checkpoint, world_size=RANKS, **LAUNCH)
loaded = {layout: minidist.launch(load_checkpoint, world_size=RANKS, args=(layout,), **LAUNCH)
          for layout in ("tp4", "dp4")}
shown = ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
         "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight",
         "transformer.h.0.ln_1.weight"]
print(table([(n, saved[0][0][n], loaded["tp4"][0]["layouts"][n], loaded["dp4"][0]["layouts"][n])
             for n in shown], ("parameter", "saved: dp2 x tp2 (on tp)",
                               "loaded: tp4", "loaded: dp4")))
for layout, results in loaded.items():
    print(f"\ninto {layout}:")
    for result in results:
        print(f"  {result['text']}; every piece bit for bit: {not result['bad']}")
metadata = Metadata.read(CKPT_PATH)
drawn_shape = tuple(metadata.tensors[DRAWN]["shape"])
dp4_boxes = layout_boxes(drawn_shape, (RANKS,), [Shard(0)])
console.print(reads_table(metadata, DRAWN, dp4_boxes))
reads_drawn = reads_of(metadata, DRAWN, dp4_boxes)     # from the metadata alone
report_is_picture = all(                                # against what each load read
    r["drawn_reads"] == sorted((c["rank"], tuple(c["offsets"]), tuple(c["sizes"]))
                               for c, _ in reads_drawn[rank])
    for rank, r in enumerate(loaded["dp4"]))
print(f"the saved chunks of this weight each dp4 rank's LoadReport lists are the table's: "
      f"{report_is_picture}")
show_figure(reads_figure(metadata, DRAWN, dp4_boxes), "checkpoint_reads.png",
            f"{DRAWN}: the chunks saved on dp2 x tp2 (filled, by writer) and the boxes of "
            "dp4's ranks (dashed)", dpi=90)

# %% jupyter={"source_hidden": true}
bit_for_bit = all(not r["bad"] for results in loaded.values() for r in results)
glue("bit_for_bit", bit_for_bit)
glue("bits_text", "every parameter's local piece on every rank of both new layouts equals the "
     "saved model's box of it, bit for bit" if bit_for_bit else
     "some local piece does not equal the saved model's box")
glue("saved_bytes", saved[0][1], ",")
glue("whole_model_bytes", sum(np.asarray(a).nbytes for a in
                              GPT(CKPT_CONFIG, rng=0, dtype=np.float64).state_dict().values()),
     ",")
glue("dp4_rank0", loaded["dp4"][0]["text"])
glue("tp4_rank0", loaded["tp4"][0]["text"])
glue("dp4_quarter", all(4 * r["bytes_read"] == r["bytes_saved"] for r in loaded["dp4"]))
drawn_reads = [r["drawn"] for r in loaded["dp4"]]
glue("drawn_rank1", drawn_reads[1])
glue("drawn_saved_layout", saved[0][0][DRAWN.removeprefix("model.")])
glue("report_is_picture", report_is_picture)
glue("report_text", "are the table's" if report_is_picture else "are not the table's")
glue("drawn_chunks_each", sorted({len(chunks) for chunks in reads_drawn.values()}) == [2])
glue("drawn_chunks_text", "2 chunks, one of each tp rank's columns" if
     sorted({len(chunks) for chunks in reads_drawn.values()}) == [2] else
     "not 2 chunks each")
say("""
{glue}`bits_text`. The checkpoint holds {glue}`saved_bytes` bytes of tensors, and one
process's state dict holds {glue}`whole_model_bytes` (lm_head's tied weight under its own name
too, as torch's state dict lists it): the dp halves held the same pieces, the whole c_attn was
on every rank, and each box went to disk once. Each rank of a new layout read only what its
box needs: in tp4 {glue}`tp4_rank0`; in dp4 {glue}`dp4_rank0` (a quarter of each
tensor's rows). The table and the picture are drawn from the checkpoint's `.metadata` alone; the chunks
each rank's load report lists for that weight {glue}`report_text`. The picture draws one weight,
block 0's `mlp.c_proj.weight`, saved {glue}`drawn_saved_layout` on tp (its columns cut, in two
chunks) and loaded `S(0)` (its rows cut in four): each new rank's dashed box crosses
{glue}`drawn_chunks_text`, and reads of each only the rows in its box ({glue}`drawn_rank1`).
""")

# %% [markdown]
# ## 9. clip_grad_norm_ wrong and right
#
# `clip_grad_norm_(parameters, max_norm)` (torch's `torch.nn.utils`, here
# `minidist.nn.utils`) computes the norm of all the gradients together,
# the square root of the sum of their squares, and scales every gradient by
# max_norm / norm when the norm is above max_norm. On one process it sees
# every gradient. On a rank of a sharded model, handed the rank's local
# shards as plain arrays, it sees only those: each rank gets the norm of its
# own piece, another on every rank, each below the true one, and each rank
# would scale its piece by another factor. The squares of the pieces'
# norms add up to the true norm's square (the pieces cut the gradient
# without overlap; FSDP1's padding adds zeros), so one all_reduce of the
# ranks' squares fixes it. That is what the global versions do: on DTensor
# parameters `clip_grad_norm_` sums each square over the mesh dims on
# which the parameter is a `Shard` (FSDP2's parameters are DTensors, so the
# plain call is right for them, as in torch), and `FullyShardedDataParallel.clip_grad_norm_` sums
# over FSDP1's group.
#
# The MLP of section 7, one backward on 4 processes (each rank 2 rows of
# the batch of 8) under FSDP1 and FSDP2; every rank computes the norm of
# its local shards' gradients alone (the plain function on plain copies of
# them), then the global one, then clips with max_norm below the norm; one
# process computes the norm of the whole gradients.

# %%
from minidist.nn.utils import clip_grad_norm_  # noqa: E402

MAX_NORM = 0.05


def norms_wrong_and_right(kind):
    """On every rank: one backward under FSDP1 or FSDP2; the norm of this rank's
    local shards alone, the global norm, and the whole gradients after clipping."""
    rank = minidist.distributed.get_rank()
    if kind == "FSDP1":
        model = FullyShardedDataParallel(fsdp_mlp(), sharding_strategy="FULL_SHARD")
    else:
        model = fsdp_mlp()
        for index in (0, 2, 4):
            fully_shard(model[index])
        fully_shard(model)
    x, y = fsdp_batch(0)
    mine = slice(rank * FSDP_ROWS, (rank + 1) * FSDP_ROWS)
    minidist.nn.CrossEntropyLoss()(model(Tensor(x[mine])), y[mine]).backward()
    local = []
    for p in model.parameters():
        plain = minidist.nn.Parameter(np.array(p.to_local().data if kind == "FSDP2" else p.data))
        plain.grad = np.array(p.grad)
        local.append(plain)
    local_norm = float(clip_grad_norm_(local, 1e30).data)      # 1e30: measure, clip nothing
    if kind == "FSDP1":
        total = float(model.clip_grad_norm_(MAX_NORM).data)
        clipped = None
    else:
        total = float(clip_grad_norm_(model.parameters(), MAX_NORM).data)
        clipped = [full_gradient(p) for p in model.parameters()]
    return local_norm, total, clipped


def full_gradient(p):
    """The whole clipped gradient of an FSDP2 parameter (an all_gather)."""
    from minidist.distributed.tensor import DTensor

    grad = DTensor.from_local(Tensor(np.array(p.grad)), p.device_mesh, p.placements,
                              shape=p.shape)
    return grad.full_tensor().numpy()


clipping = {kind: minidist.launch(norms_wrong_and_right, world_size=RANKS, args=(kind,), **LAUNCH)
            for kind in ("FSDP1", "FSDP2")}
whole_model = fsdp_mlp()
x0, y0 = fsdp_batch(0)
minidist.nn.CrossEntropyLoss()(whole_model(Tensor(x0)), y0).backward()
true_norm = float(clip_grad_norm_(whole_model.parameters(), MAX_NORM).data)
rows = []
for kind, results in clipping.items():
    local = [r[0] for r in results]
    rows.append((kind, *(f"{v:.6f}" for v in local), f"{np.sqrt(sum(v * v for v in local)):.6f}",
                 f"{results[0][1]:.6f}"))
rows.append(("one process", *([""] * RANKS), "", f"{true_norm:.6f}"))
print(table(rows, ("", *(f"rank {r}: its shards" for r in range(RANKS)),
                   "sqrt(sum of squares)", "global")))
clip_error = max(float(np.abs(got - p.grad).max()) for got, p in
                 zip(clipping["FSDP2"][0][2], whole_model.parameters(), strict=True))
print("the factor each rank would scale by, max_norm / its norm: FSDP2 "
      + ", ".join(f"{MAX_NORM / r[0]:.3f}" for r in clipping["FSDP2"])
      + f"; the right one, max_norm / the global norm: {MAX_NORM / true_norm:.3f} "
      f"(max_norm = {MAX_NORM})")
print(f"FSDP2's gradients after the global clip against one process's clipped ones: largest "
      f"difference {clip_error:.1e}")

# %% jupyter={"source_hidden": true}
fsdp2_local = [r[0] for r in clipping["FSDP2"]]
fsdp1_local = [r[0] for r in clipping["FSDP1"]]
glue("fsdp2_local_norms", ", ".join(f"{v:.4f}" for v in fsdp2_local))
glue("fsdp1_local_norms", ", ".join(f"{v:.4f}" for v in fsdp1_local))
glue("true_norm", true_norm, ".4f")
all_below = all(v < true_norm for v in fsdp1_local + fsdp2_local)
glue("all_below", all_below)
glue("below_text", "every one of them below the true norm" if all_below else
     "not all of them below the true norm")
squares_sum = all(abs(sum(v * v for v in local) - true_norm ** 2) <= 1e-12 * true_norm ** 2
                  for local in (fsdp1_local, fsdp2_local))
glue("squares_sum", squares_sum)
glue("squares_text", "add up to the true norm's square (to 1e-12)" if squares_sum else
     "do not add up to the true norm's square")
global_right = all(abs(r[1] - true_norm) <= 1e-12 * true_norm
                   for results in clipping.values() for r in results)
glue("global_right", global_right)
glue("global_text", "equals one process's on every rank (to 1e-12)" if global_right else
     "differs from one process's")
glue("clip_error", clip_error, ".1e")
glue("distinct_norms", all(len({round(v, 12) for v in local}) == RANKS
                           for local in (fsdp1_local, fsdp2_local)))
glue("fsdp2_smallest_rank", int(np.argmin(fsdp2_local)))
say("""
Each rank's norm of its own shards: under FSDP1 {glue}`fsdp1_local_norms`, under FSDP2
{glue}`fsdp2_local_norms`, against the true {glue}`true_norm`: another on every rank,
{glue}`below_text`. Under FSDP2 the smallest is rank {glue}`fsdp2_smallest_rank`'s, which holds
one row of the first weight and nothing of the others. Their squares {glue}`squares_text`, under both.
The global norm {glue}`global_text`, and after clipping by it FSDP2's whole gradients are one
process's clipped gradients, the largest difference {glue}`clip_error`. Clipped by its own
norm, each rank would have scaled its piece by its own factor (the factors printed above): the clipped
gradient would no longer point where the gradient points.
""")
