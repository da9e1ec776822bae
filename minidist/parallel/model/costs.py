"""Bytes moved for one dense layer: data parallel vs the two model splits (lesson 10).

The worked example of Tim Dettmers' "Model Parallelism in Deep Learning" (2014):
a dense layer with a 1000 x 500 weight matrix (in_features=1000,
out_features=500), batch 128, two workers.

* Data parallel sends the weight gradient once per step: 1000 x 500 =
  **500,000** values.
* The row split (weight rows = input features split, the input whole on
  every worker) sends its 128 x 500 partial output forward (added) and its
  128 x 1000/2 = 128 x 500 piece of the input gradient backward (stacked):
  64,000 + 64,000 = **128,000** values.
* The column split (output features split) sends its 128 x 500/2 = 128 x 250
  output piece forward (stacked) and its 128 x 1000 partial input gradient
  backward (added): 32,000 + 128,000 = **160,000** values.

Those are the sizes of the matrices one worker contributes (the column
"payload" below). What a rank actually *sends* depends on the collective
and its algorithm; with the ring algorithms the layers of
:mod:`minidist.parallel.tensor.layers` use, on n ranks:

* ring all_reduce of N values: rank r sends every chunk but one in the
  reduce-scatter and every chunk but one in the allgather,
  2 N - c[(r+1) mod n] - c[(r+2) mod n] values, where c are the n chunk
  sizes (``numpy.array_split``'s: the first N mod n chunks one larger);
  exactly 2 (n-1)/n N when n divides N. On 2 ranks: N.
* ring all_gather of n pieces of P values each: every rank sends the n - 1
  pieces it does not own, (n - 1) P values. On 2 ranks: P.

So on 2 ranks the values each rank sends are exactly Dettmers' counts.

What :func:`split_bytes` counts, per rank and per training step of one layer
(one forward and one backward pass), in values and bytes (``itemsize`` bytes
a value):

* ``data_parallel``: forward nothing; backward (the step) all_reduce of
  the weight gradient dA, in x out values (Y = X A: A is nn.Linear's
  weight W transposed).
* ``column`` (gather_output=True): forward all_gather of the output pieces,
  B x out/n each; backward all_reduce of the partial input gradients dX,
  B x in.
* ``row`` (input_is_parallel=False): forward all_reduce of the partial
  outputs Y, B x out; backward all_gather of the input-gradient pieces,
  B x in/n each.
* ``column_split_output`` (gather_output=False, Megatron's default):
  forward nothing; backward all_reduce of dX, B x in.
* ``row_split_input`` (input_is_parallel=True, Megatron's default):
  forward all_reduce of Y, B x out; backward nothing.

A column split then a row split (the MLP block) sends
``column_split_output`` + ``row_split_input``: one all_reduce per pass.

The counted bytes are the ``bytes`` of the rank's ``send`` events in the
trace (the transport's messages of the collectives; receives are the mirror
image), per rank: the tests run each split with tracing on and compare
exactly. Not counted: the bias (data parallel's bias gradient, out values,
is left out as by Dettmers; a split's bias needs no message). Assumed, as
by Dettmers: the layer's input needs a gradient (there is a layer below it);
for a first layer fed with data the backward collective of dX does not run
and its backward sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.distributed.collectives.traffic import ring_all_gather_sent, ring_all_reduce_sent

#: The rows of :class:`SplitBytes`, in order.
STRATEGIES = ("data_parallel", "column", "row", "column_split_output", "row_split_input")

_DESCRIPTIONS = {
    "data_parallel": "data parallel",
    "column": "column split, gather_output=True",
    "row": "row split, input_is_parallel=False",
    "column_split_output": "column split, gather_output=False",
    "row_split_input": "row split, input_is_parallel=True",
}


@dataclass(frozen=True)
class Traffic:
    """One row: what one strategy sends for one layer in one step.

    ``forward_values`` and ``backward_values`` hold the values each rank
    sends (one entry per rank, rank order); ``payload`` is Dettmers' count,
    the size of the matrices one rank contributes (forward + backward)."""

    name: str
    description: str
    forward: str
    backward: str
    forward_values: tuple[int, ...]
    backward_values: tuple[int, ...]
    payload: int
    itemsize: int

    @property
    def values_per_rank(self) -> tuple[int, ...]:
        return tuple(f + b for f, b in zip(self.forward_values, self.backward_values))

    @property
    def bytes_per_rank(self) -> tuple[int, ...]:
        return tuple(v * self.itemsize for v in self.values_per_rank)

    @property
    def forward_bytes(self) -> tuple[int, ...]:
        return tuple(v * self.itemsize for v in self.forward_values)

    @property
    def backward_bytes(self) -> tuple[int, ...]:
        return tuple(v * self.itemsize for v in self.backward_values)

    @property
    def total_bytes(self) -> int:
        """Bytes sent by all ranks together."""
        return sum(self.bytes_per_rank)


@dataclass(frozen=True)
class SplitBytes:
    """The table :func:`split_bytes` returns; ``table["row"]`` is a row,
    ``str(table)`` the printable table."""

    in_features: int
    out_features: int
    batch: int
    world_size: int
    itemsize: int
    rows: tuple[Traffic, ...]

    def __getitem__(self, name: str) -> Traffic:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no row {name!r}; the rows are {list(STRATEGIES)}")

    def __str__(self) -> str:
        return format_table(self)


def _shape(rows: int, columns: int) -> str:
    return f"{rows}x{columns}"


def split_bytes(in_features: int, out_features: int, batch: int, world_size: int,
                itemsize: int = 4, algorithm: str = "ring") -> SplitBytes:
    """The bytes each rank sends in one training step of one dense layer
    ``in_features -> out_features`` at ``batch``, for data parallel and each
    model split on ``world_size`` ranks, with ring collectives (see the module
    docstring for the table and the formulas).

    B = batch, n = world_size, all counts in values per rank (times
    ``itemsize`` for bytes), AR(N) = the ring all_reduce of N values
    (2 (n-1)/n N when n divides N), AG(P) = the ring all_gather of pieces of
    P values ((n-1) P):

    * data parallel: AR(out * in) (the weight gradient; the batch is split)
    * column, gather_output=True: AG(B * out/n) forward + AR(B * in) backward
    * row, input_is_parallel=False: AR(B * out) forward + AG(B * in/n) backward
    * column, gather_output=False: AR(B * in) backward only
    * row, input_is_parallel=True: AR(B * out) forward only
    """
    if algorithm != "ring":
        raise ValueError(f"split_bytes counts the ring algorithms only (the layers' default), "
                         f"got algorithm={algorithm!r}")
    for name, value in (("in_features", in_features), ("out_features", out_features),
                        ("batch", batch), ("world_size", world_size), ("itemsize", itemsize)):
        if int(value) < 1:
            raise ValueError(f"split_bytes needs {name} >= 1, got {value}")
    n, B = world_size, batch
    if out_features % n or in_features % n:
        raise ValueError(f"split_bytes: world_size={n} must divide out_features={out_features} "
                         f"(column split) and in_features={in_features} (row split)")
    none = (0,) * n
    ar_weight = ring_all_reduce_sent(out_features * in_features, n)
    ar_input = ring_all_reduce_sent(B * in_features, n)
    ar_output = ring_all_reduce_sent(B * out_features, n)
    ag_output = ring_all_gather_sent(B * out_features // n, n)
    ag_input = ring_all_gather_sent(B * in_features // n, n)
    dw = _shape(in_features, out_features)
    y_piece, y_whole = _shape(B, out_features // n), _shape(B, out_features)
    x_piece, x_whole = _shape(B, in_features // n), _shape(B, in_features)
    specs = {
        "data_parallel": ("-", f"all_reduce dA {dw}", none, ar_weight,
                          out_features * in_features),
        "column": (f"all_gather Y {y_piece}", f"all_reduce dX {x_whole}", ag_output, ar_input,
                   B * out_features // n + B * in_features),
        "row": (f"all_reduce Y {y_whole}", f"all_gather dX {x_piece}", ar_output, ag_input,
                B * out_features + B * in_features // n),
        "column_split_output": ("-", f"all_reduce dX {x_whole}", none, ar_input,
                                B * in_features),
        "row_split_input": (f"all_reduce Y {y_whole}", "-", ar_output, none, B * out_features),
    }
    rows = tuple(Traffic(name, _DESCRIPTIONS[name], *specs[name], itemsize=itemsize)
                 for name in STRATEGIES)
    return SplitBytes(in_features, out_features, batch, world_size, itemsize, rows)


def _per_rank(values: tuple[int, ...]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}..{high:,}"


def format_table(table: SplitBytes, measured: dict | None = None) -> str:
    """The table as text. ``measured`` (row name -> bytes sent per rank, e.g.
    counted from a trace) adds a column to compare with the formula."""
    header = (f"Dense layer {table.in_features} -> {table.out_features} "
              f"(Y = X A, weight A in x out = {table.in_features} x {table.out_features}, "
              f"its gradient dA), batch {table.batch}, "
              f"{table.world_size} ranks, {table.itemsize}-byte values, ring collectives; "
              "sent per rank per step (contributed: values of the matrices one rank puts "
              "into the collectives, Dettmers' count)")
    columns = ["strategy", "forward", "backward", "contributed", "values sent", "bytes sent"]
    if measured is not None:
        columns.append("bytes in trace")
    lines = []
    for row in table.rows:
        cells = [row.description, row.forward, row.backward, f"{row.payload:,}",
                 _per_rank(row.values_per_rank), _per_rank(row.bytes_per_rank)]
        if measured is not None:
            cells.append(_per_rank(tuple(measured[row.name])) if row.name in measured else "")
        lines.append(cells)
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(columns)]

    def render(cells):
        return "  ".join(cell.ljust(width) if i < 3 else cell.rjust(width)
                         for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([header, render(columns), render(["-" * w for w in widths])]
                     + [render(line) for line in lines])
