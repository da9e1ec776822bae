"""Exercise tensor_parallel_attention: the communication of an attention split by heads.

Check it with `minidist exercise check tensor_parallel_attention`: the
checker runs your function on 2 and 4 real processes against the whole
(unsplit) attention block, and reads from the run's trace where your
collectives went.

The split (built for you, as Megatron and minidist.parallel.tensor.gpt
build it). The heads of an attention block are independent of each other
until c_proj mixes them, so on n ranks each rank keeps n_head / n heads:

* of c_attn (C -> 3C, the fused q, k, v projection), the rows that make
  its heads' q, k and v: a column-parallel layer;
* of c_proj (C -> C), the columns that read its heads' outputs: a
  row-parallel layer; its bias is whole on every rank.

One rank's forward, with your function called at two points, f and g:

    x --f--> c_attn shard --> my heads' attention --> c_proj shard --g--> + bias --> y
    (B,T,C)   (B,T,3C/n)         (B,T,C/n)             (B,T,C)                  (B,T,C)

and the backward runs the same line right to left: g's backward gets y's
gradient, f's backward gets x's gradient (after c_attn's backward). Between
c_attn and c_proj nothing is sent: each rank's heads need only their own
q, k, v. The question of the exercise is what f and g must do so that
every rank ends with the whole block's y, and with the right gradient of
x (which comes from the layer below, whole on every rank, as it goes back
to it). Think about what each rank holds at each point:

* going forward, at f: x, the same whole x on every rank;
  at g: c_proj's product over *my* heads' columns only;
* going backward, at g: y's gradient, the same on every rank (y is);
  at f: the gradient of x through *my* heads only.

Which of these four are complete, and which are one rank's share of a sum?

Available inside: ``import minidist.distributed as dist`` and
``dist.get_rank()``, ``dist.get_world_size()``, ``dist.all_reduce(array)``
(sums ``array`` over the ranks, in place; ``op=dist.ReduceOp.SUM`` is the
default).
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def attention_communication(array, operator, direction):
    """Return what flows on past the point (operator, direction).

    operator: "f" (before c_attn) or "g" (after c_proj);
    direction: "forward" (``array`` is the activation) or "backward"
    (``array`` is the gradient coming back). ``array`` is a float64
    (B, T, C) NumPy array, this rank's own copy: change it in place and
    return it, or return a new array of the same shape. Every rank calls
    this at the same four points, in the same order: f forward, g forward,
    g backward, f backward.

    Megatron's paper names the two operators f and g; minidist's
    tensor_parallel.py calls them copy_to_parallel_region and
    reduce_from_parallel_region (read those after, not before).

    Cost to reach, per rank: one all_reduce of B T C values in the forward
    and one in the backward, the whole communication of the block; at the
    other two points, nothing.
    """
    raise NotWrittenYet("write attention_communication: at which of the four points is "
                        "what a rank holds only its own heads' share of a sum?")
