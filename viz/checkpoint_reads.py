"""Which saved chunks each new rank reads when a checkpoint is resharded, as a
PNG and in the terminal.

One tensor of a checkpoint (``minidist.distributed.checkpoint``) is drawn as
its global shape: every saved chunk a filled box, coloured by the rank that
wrote it; every rank of the new layout its box outlined (dashed) and named.
A new rank reads the chunks its outline meets (of each, the rows its
outline spans): the table beside it lists them, with the bytes read out of
the tensor's whole. ::

    from minidist.distributed.checkpoint import Metadata
    from viz.checkpoint_reads import layout_boxes, reads_figure, reads_table
    metadata = Metadata.read("ckpt")
    boxes = layout_boxes((32, 8), (4,), [Shard(0)])      # FSDP2's dp4
    reads_figure(metadata, "model.transformer.h.0.mlp.c_fc.weight", boxes)
    Console().print(reads_table(metadata, "model.transformer.h.0.mlp.c_fc.weight", boxes))

A 1-D tensor is drawn as one row; a tensor of more dimensions is refused
(draw one of its 2-D slices' keys instead). Drawing reads the metadata
only, no shard file and no process.
"""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from rich.table import Table

from minidist.atomic_file import atomic_path
from minidist.distributed.checkpoint.metadata import overlap, rows_to_read, volume
from minidist.distributed.tensor import local_shape_and_offset
from minidist.units import format_bytes

#: One colour per writing rank (matplotlib's tab10, colour-blind friendly enough).
WRITER_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def layout_boxes(shape, mesh_shape, placements) -> dict:
    """``{rank: (offsets, sizes)}``: the box each rank of a row-major mesh holds
    under ``placements`` (what ``DTensor`` gives that rank)."""
    boxes = {}
    for rank, coordinate in enumerate(itertools.product(*(range(n) for n in mesh_shape))):
        sizes, offsets = local_shape_and_offset(shape, mesh_shape, coordinate, placements)
        boxes[rank] = (tuple(offsets), tuple(sizes))
    return boxes


def reads_of(metadata, key, boxes) -> dict:
    """``{new rank: [(saved chunk, bytes read of it), ...]}``: the chunks whose
    box meets the rank's, and the run of their rows a load reads."""
    entry = _entry(metadata, key)
    itemsize = np.dtype(entry["dtype"]).itemsize
    out = {}
    for rank, (offsets, sizes) in boxes.items():
        out[rank] = []
        for chunk in entry["chunks"]:
            met = overlap(offsets, sizes, chunk["offsets"], chunk["sizes"])
            if volume(sizes) and met is not None:
                out[rank].append((chunk, rows_to_read(chunk, *met, itemsize)[0][1]))
    return out


def _entry(metadata, key):
    if key not in metadata.tensors:
        raise KeyError(f"{key!r} is not a tensor of this checkpoint; its tensors are "
                       f"{sorted(metadata.tensors)[:5]}...")
    entry = metadata.tensors[key]
    if len(entry["shape"]) > 2:
        raise ValueError(f"{key!r} has {len(entry['shape'])} dimensions; the picture draws "
                         f"1-D and 2-D tensors")
    return entry


def _rect(offsets, sizes):
    """(x, y, width, height) with rows down: dim 0 is y, dim 1 is x."""
    if len(sizes) == 1:
        return offsets[0], 0, sizes[0], 1
    return offsets[1], offsets[0], sizes[1], sizes[0]


def reads_figure(metadata, key, boxes) -> Figure:
    """The picture (the module docstring)."""
    entry = _entry(metadata, key)
    shape = entry["shape"]
    rows, columns = (1, shape[0]) if len(shape) == 1 else shape
    figure = Figure(figsize=(9, 4.6))
    FigureCanvasAgg(figure)
    axes = figure.add_axes([0.06, 0.14, 0.62, 0.72])
    writers = sorted({c["rank"] for c in entry["chunks"]})
    for chunk in entry["chunks"]:
        x, y, w, h = _rect(chunk["offsets"], chunk["sizes"])
        colour = WRITER_COLOURS[chunk["rank"] % len(WRITER_COLOURS)]
        axes.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=0.35, edgecolor=colour,
                                 linewidth=1.5))
    for rank, (offsets, sizes) in boxes.items():
        if not volume(sizes):
            continue
        x, y, w, h = _rect(offsets, sizes)
        axes.add_patch(Rectangle((x + 0.08, y + 0.08), w - 0.16, h - 0.16, fill=False,
                                 edgecolor="black", linestyle="--", linewidth=1.2))
        axes.text(x + w / 2, y + h / 2, f"new {rank}", ha="center", va="center", fontsize=8)
    axes.set_xlim(0, columns)
    axes.set_ylim(rows, 0)
    axes.set_xlabel("dim 1" if len(shape) == 2 else "dim 0")
    if len(shape) == 2:
        axes.set_ylabel("dim 0")
    else:
        axes.set_yticks([])
    axes.set_title(f"{key}\n{tuple(shape)} {np.dtype(entry['dtype']).name}: saved chunks and new boxes",
                   fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, facecolor=WRITER_COLOURS[r % len(WRITER_COLOURS)],
                         alpha=0.35, label=f"written by rank {r}") for r in writers]
    handles.append(Rectangle((0, 0), 1, 1, fill=False, linestyle="--", edgecolor="black",
                             label="a new rank's box"))
    figure.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.70, 0.86), fontsize=8,
                  frameon=False)
    lines = [_summary(rank, chunks, entry) for rank, chunks in
             reads_of(metadata, key, boxes).items()]
    figure.text(0.70, 0.14, "\n".join(lines[:12]), fontsize=7, va="bottom", family="monospace")
    return figure


def _summary(rank, chunks, entry):
    whole = sum(c["nbytes"] for c in entry["chunks"])
    nbytes = sum(n for _, n in chunks)
    return (f"new {rank}: {len(chunks)} of {len(entry['chunks'])} chunks, "
            f"{format_bytes(nbytes)} of {format_bytes(whole)}")


def save_reads_figure(metadata, key, boxes, path) -> str:
    figure = reads_figure(metadata, key, boxes)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    return str(path)


def reads_table(metadata, key, boxes) -> Table:
    """The terminal's view: one row per new rank, its box, the chunks it reads
    (by writer rank and box), and the bytes."""
    entry = _entry(metadata, key)
    whole = sum(c["nbytes"] for c in entry["chunks"])
    table = Table(title=f"{key} {tuple(entry['shape'])}: what each new rank reads")
    for column in ("new rank", "its box", "saved chunks read", "bytes read"):
        table.add_column(column)
    for rank, chunks in reads_of(metadata, key, boxes).items():
        offsets, sizes = boxes[rank]
        box = "empty" if not volume(sizes) else _box_text(offsets, sizes)
        read = ", ".join(f"rank {c['rank']} {_box_text(c['offsets'], c['sizes'])}"
                         for c, _ in chunks) or "none"
        table.add_row(str(rank), box, read,
                      f"{format_bytes(sum(n for _, n in chunks))} of {format_bytes(whole)}")
    return table


def _box_text(offsets, sizes) -> str:
    """``[0:16, 0:8]``: the box as slices."""
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes)) + "]"


__all__ = ["layout_boxes", "reads_figure", "reads_of", "reads_table", "save_reads_figure"]
