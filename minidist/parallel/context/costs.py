"""What context-parallel attention sends, by formula: the bytes each rank's
sends carry in one attention layer's forward and backward, for ring
attention (:mod:`minidist.parallel.context.ring_attention`) and Ulysses
(:mod:`minidist.parallel.context.ulysses`), as minidist's code moves them. The tests
hold both to the trace, byte for byte.

Notation: B batch, H heads, T positions, D the query / key head width, Dv
the value's, n ranks, s bytes a value, L_o the positions rank o holds
(:func:`~minidist.parallel.context.split.rank_positions`; T/n each when 2n
divides T).

==============  =============================================================
ring, forward   sum over s = 0 .. n-2 of  B H L_(r-s) (D + Dv) s
                (the K, V block of rank r - s, one message a step)
ring, backward  the forward's K, V messages again,
                + sum over all n owners o of  B H L_o (D + Dv) s
                (each block's dK, dV, one hop per rank on the way home)
Ulysses, fwd    (n-1) B (H/n) L_r (2D + Dv) s         q, k, v: sequence -> heads
                + B (H/n) (T - L_r) Dv s               O: heads -> sequence
Ulysses, bwd    (n-1) B (H/n) L_r Dv s                 dO: sequence -> heads
                + B (H/n) (T - L_r) (2D + Dv) s        dq, dk, dv: heads -> sequence
==============  =============================================================

With even blocks and D = Dv, per rank and pass:

* ring: forward 2 (n-1) B H (T/n) D s, backward 2 (2n-1) B H (T/n) D s;
* Ulysses: 4 (n-1) B H (T/n^2) D s each way.

Ulysses sends n/2 times less forward (and n (2n-1) / (2 (n-1)) times less backward)
and in n - 1 messages per all_to_all of 1/n each, where the ring sends
whole blocks, one a step; but its ranks wait for the all_to_all before
attending (the ring overlaps its messages with the blocks' arithmetic),
and n cannot pass H.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.parallel.context.split import rank_positions


@dataclass(frozen=True)
class AttentionBytes:
    """Bytes each rank sends in one attention layer: ``forward[r]``, ``backward[r]``."""

    scheme: str
    forward: tuple[int, ...]
    backward: tuple[int, ...]


def _lengths(seq_len, world, layout):
    return [len(rank_positions(seq_len, world, rank, layout)) for rank in range(world)]


def ring_attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int, world: int,
                         itemsize: int, value_dim: int | None = None,
                         layout: str = "zigzag") -> AttentionBytes:
    """Ring attention's bytes per rank (the module's table)."""
    value_dim = head_dim if value_dim is None else value_dim
    lengths = _lengths(seq_len, world, layout)
    block = [batch * heads * length * (head_dim + value_dim) * itemsize for length in lengths]
    forward = tuple(sum(block[(rank - step) % world] for step in range(world - 1))
                    for rank in range(world))
    grads = sum(block) if world > 1 else 0
    return AttentionBytes("ring", forward, tuple(sent + grads for sent in forward))


def ulysses_bytes(batch: int, heads: int, seq_len: int, head_dim: int, world: int,
                  itemsize: int, value_dim: int | None = None,
                  layout: str = "zigzag") -> AttentionBytes:
    """Ulysses' bytes per rank (the module's table); H divisible by n."""
    if heads % world:
        raise ValueError(f"Ulysses splits {heads} heads over {world} ranks: not divisible")
    value_dim = head_dim if value_dim is None else value_dim
    lengths = _lengths(seq_len, world, layout)
    group = batch * (heads // world) * itemsize
    forward, backward = [], []
    for length in lengths:
        others = seq_len - length
        forward.append(group * ((world - 1) * length * (2 * head_dim + value_dim)
                                + others * value_dim))
        backward.append(group * ((world - 1) * length * value_dim
                                 + others * (2 * head_dim + value_dim)))
    return AttentionBytes("ulysses", tuple(forward), tuple(backward))


def format_attention_bytes(costs: list[AttentionBytes], measured: dict | None = None) -> str:
    """A small table: per scheme and pass, each rank's bytes by formula (and
    in the trace, when ``measured[(scheme, pass)]`` gives them)."""
    lines = [f"{'scheme':<8} {'pass':<9} {'formula, per rank':<36} in the trace"]
    for cost in costs:
        for name in ("forward", "backward"):
            formula = getattr(cost, name)
            seen = (measured or {}).get((cost.scheme, name))
            lines.append(f"{cost.scheme:<8} {name:<9} {str(list(formula)):<36} "
                         f"{list(seen) if seen is not None else '-'}")
    return "\n".join(lines)


__all__ = ["AttentionBytes", "ring_attention_bytes", "ulysses_bytes", "format_attention_bytes"]
