"""What tensor and sequence parallelism cost on the GPT, by formula: the bytes
each rank sends per training step, and the activation bytes each rank keeps
for backward (:mod:`minidist.parallel.tensor.gpt`).

Notation: B sequences of T tokens, width d, H heads, L blocks, vocabulary V
of which this rank holds V_r words, n ranks, s bytes a value.

**Bytes** (:func:`gpt_step_bytes`), ring collectives as in
:mod:`minidist.parallel.model.costs`: AR(N) a ring all_reduce of N
values (2 (n-1)/n N per rank when n divides N), RS(N) a ring reduce_scatter
of N values ((n-1)/n N), AG(P) a ring all_gather of pieces of P values
((n-1) P). Per rank, per step:

==========  ===================================  ==========================================
            tensor parallel                      + sequence parallel
==========  ===================================  ==========================================
forward     (2L + 1) AR(BTd) + 3 AR(BT)          (2L + 1) [RS(BTd) + AG(BTd/n)] + 3 AR(BT)
backward    (2L + 1) AR(BTd)                     (2L + 1) [RS(BTd) + AG(BTd/n)] + AR(P_sp)
==========  ===================================  ==========================================

2L + 1: the embedding and the L blocks' two row layers forward, the L
blocks' two column layers and ``lm_head`` backward; 3 AR(BT): the loss's
max, target logit and exp sum. As AR(N) = RS(N) + AG(N/n) in a ring, the
sequence-parallel step sends the same bytes plus P_sp, the gradients of the
replicated parameters used on T/n positions: L (2 LayerNorms, 2 row-layer
biases) + ln_f + the whole (block_size, d) ``wpe``; 6 L d + 2 d +
block_size d values with biases.

**Activations** (:func:`gpt_activation_bytes`): what the ledger of
:mod:`minidist.memory` counts after the forward pass and the loss, the
arrays the autograd graph keeps alive (every node's output and what each
local backward captured, each byte once). Per block it is the course's one
count, :func:`minidist.memory.transformer_block_activation_terms` (its
docstring gives it term by term): in values, tensor parallel

    B T d (12 + 17/n) + 2 B T + B H T^2 / n

and with sequence parallelism (n >= 2)

    B T d (4 + 27/n) + 2 B T / n + B H T^2 / n

(16/n and 26/n when a rank has one head: its heads' output needs no copy).

Outside the blocks: the embedding (lookup, mask product, sum: BTd each,
with sequence parallelism the sum BTd/n; the position rows and their sum),
ln_f, the logits (B T V_r), the loss's exp (B T V_r) and sums, and the
integer arrays (8 bytes a value: the token rows looked up, the positions,
the loss's target columns; 1 byte: its mask); :func:`gpt_activation_bytes`
lists them.

The tests hold the formula to the ledger's count, byte for byte, in float32
and float64 on 2 and 4 ranks, with and without sequence parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.distributed.collectives.traffic import ring_all_gather_sent, ring_all_reduce_sent
from minidist.memory import transformer_block_activation_bytes
from minidist.parallel.tensor.vocab import vocab_range

INDEX_BYTES = 8   # NumPy's int64 token ids and positions
MASK_BYTES = 1    # a bool


def ring_reduce_scatter_sent(count: int, world_size: int) -> tuple[int, ...]:
    """Values each rank sends in a ring reduce_scatter of ``count`` values
    (n divides count): the n - 1 chunks it does not end with."""
    if count % world_size:
        raise ValueError(f"a reduce_scatter of {count} values needs {world_size} equal pieces")
    return ((world_size - 1) * (count // world_size),) * world_size


def _add(*parts):
    return tuple(sum(values) for values in zip(*parts))


def _times(k, values):
    return tuple(k * v for v in values)


@dataclass(frozen=True)
class StepBytes:
    """Bytes each rank sends in one step (one entry per rank, rank order),
    and ``lines``: (pass, what, count, values per rank of one) for a table."""

    forward: tuple[int, ...]
    backward: tuple[int, ...]
    lines: tuple
    itemsize: int

    @property
    def total(self) -> tuple[int, ...]:
        return _add(self.forward, self.backward)

    def __str__(self) -> str:
        return format_step_bytes(self)


def sequence_parallel_values(config) -> int:
    """P_sp: the values of the replicated parameters whose gradients
    sequence parallelism sums over the group after backward."""
    norms = 2 * config.n_layer + 1
    per_norm = 2 if config.bias else 1
    biases = 2 * config.n_layer * config.n_embd if config.bias else 0
    return norms * per_norm * config.n_embd + biases + config.block_size * config.n_embd


def gpt_step_bytes(config, batch: int, steps: int, world_size: int,
                   sequence_parallel: bool = False, itemsize: int = 4) -> StepBytes:
    """The bytes each rank sends in one training step (forward with the
    loss, backward, and with sequence parallelism the gradient sum) of the
    GPT of ``config`` split by :func:`~minidist.parallel.tensor.gpt.tensor_parallel_gpt`
    over ``world_size`` ranks, for ``batch`` sequences of ``steps`` tokens
    (the module docstring's table)."""
    n, tokens, width = world_size, batch * steps, config.n_embd
    halves = 2 * config.n_layer + 1
    loss = ring_all_reduce_sent(tokens, n)
    zero = (0,) * n
    if not sequence_parallel:
        whole = ring_all_reduce_sent(tokens * width, n)
        lines = (("forward", f"all_reduce (B,T,d) {batch}x{steps}x{width}", halves, whole),
                 ("forward", f"all_reduce (B,T) {batch}x{steps} (loss)", 3, loss),
                 ("backward", f"all_reduce (B,T,d) {batch}x{steps}x{width}", halves, whole))
    else:
        if steps % n:
            raise ValueError(f"gpt_step_bytes: sequence parallelism needs steps={steps} "
                             f"divisible by world_size={n}")
        scatter = ring_reduce_scatter_sent(tokens * width, n) if n > 1 else zero
        gather = ring_all_gather_sent(tokens * width // n, n)
        grads = ring_all_reduce_sent(sequence_parallel_values(config), n)
        piece = f"{batch}x{steps // n}x{width}"
        lines = (("forward", f"reduce_scatter (B,T,d) {batch}x{steps}x{width}", halves, scatter),
                 ("forward", f"all_gather (B,T/n,d) {piece}", halves, gather),
                 ("forward", f"all_reduce (B,T) {batch}x{steps} (loss)", 3, loss),
                 ("backward", f"reduce_scatter (B,T,d) {batch}x{steps}x{width}", halves, scatter),
                 ("backward", f"all_gather (B,T/n,d) {piece}", halves, gather),
                 ("backward", "all_reduce of the sequence-parallel gradients", 1, grads))
    forward = _add(zero, *(_times(count, values) for p, _, count, values in lines if p == "forward"))
    backward = _add(zero, *(_times(count, values) for p, _, count, values in lines if p == "backward"))
    return StepBytes(_times(itemsize, forward), _times(itemsize, backward), lines, itemsize)


def _per_rank(values) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}..{high:,}"


def format_step_bytes(table: StepBytes, measured: dict | None = None) -> str:
    """The table as text; ``measured`` ({"forward": per rank, "backward": per
    rank}, bytes counted from a trace) is printed next to the formula. Its
    columns: the pass, the collective and the array it moves (its shape and
    sizes), how many calls of it a step makes, and the bytes a rank sends in
    them (one number when every rank sends the same, else lowest..highest)."""
    header = ("pass", "collective, array", "calls", "bytes a rank")
    if measured is not None:
        header += ("in the trace",)
    rows = [header] + [(p, what, str(count), _per_rank(_times(count * table.itemsize, values)))
                       for p, what, count, values in table.lines]
    for name in ("forward", "backward"):
        formula = getattr(table, name)
        cells = [name, "total", "", _per_rank(formula)]
        if measured is not None:
            cells.append(_per_rank(measured[name]))
        rows.append(tuple(cells))
    widths = [max(len(row[i]) for row in rows if len(row) > i) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths + [0])))
                     .rstrip() for row in rows)


@dataclass(frozen=True)
class ActivationBytes:
    """Activation bytes one rank keeps after forward and loss: ``per_block``
    (one block), ``outside`` (embedding, ln_f, logits, loss: name -> bytes),
    ``total`` = L * per_block + sum of outside."""

    per_block: int
    outside: dict
    n_layer: int

    @property
    def total(self) -> int:
        return self.n_layer * self.per_block + sum(self.outside.values())


def gpt_activation_bytes(config, batch: int, steps: int, world_size: int, rank: int = 0,
                         sequence_parallel: bool = False, itemsize: int = 4) -> ActivationBytes:
    """The module docstring's formula: the activation bytes rank ``rank`` of
    ``world_size`` keeps for one step of the split GPT, its blocks counted by
    :func:`minidist.memory.transformer_block_activation_bytes` (``world_size``
    >= 2 with ``sequence_parallel``; ``world_size`` 1 counts the unsplit
    blocks)."""
    n, s = world_size, itemsize
    B, T, C = batch, steps, config.n_embd
    start, stop = vocab_range(config.vocab_size, rank, n)
    vocab = stop - start
    btc, bt = B * T * C, B * T
    if sequence_parallel and (n < 2 or T % n):
        raise ValueError("gpt_activation_bytes: sequence parallelism needs world_size >= 2 "
                         f"dividing steps={T}")
    t_local = T // n if sequence_parallel else T
    per_block = transformer_block_activation_bytes(B, T, C, config.n_head, s, tp=n,
                                                   sequence_parallel=sequence_parallel)
    residual = B * t_local * C
    outside = {
        "embedding (lookup, mask product, sum, + positions)": (
            (2 * btc + 2 * residual + t_local * C + bt) * s + INDEX_BYTES * (bt + t_local)),
        "ln_f (output, x_hat, rstd)": (2 * residual + B * t_local) * s,
        "lm_head input gathered": btc * s if sequence_parallel else 0,
        "logits and the loss's exp": 2 * bt * vocab * s,
        "loss (value, exp sums, target columns and mask)": (
            s + bt * s + bt * INDEX_BYTES + bt * MASK_BYTES),
    }
    return ActivationBytes(per_block, outside, config.n_layer)


__all__ = ["gpt_step_bytes", "gpt_activation_bytes", "format_step_bytes", "StepBytes",
           "ActivationBytes", "ring_reduce_scatter_sent", "sequence_parallel_values"]
