"""What ZeRO's stages hold and send, by formula (lesson 12).

Per rank, fp32 training with Adam, a model of P parameters on N ranks
(bytes per parameter: 4 weights, 4 gradient, 8 Adam's two moments):

====================  ==========================  ===========================
stage                 bytes per parameter, rank   bytes each rank sends/step
====================  ==========================  ===========================
DDP                   4 + 4 + 8 = 16              all_reduce 2 (N-1)/N P
1 optimizer state     4 + 4 + 8/N                 all_reduce + all_gather 3 (N-1)/N P
2 + gradients         4 + (4 + 8)/N               reduce_scatter + all_gather 2 (N-1)/N P
3 + parameters        16/N                        2 all_gathers + reduce_scatter 3 (N-1)/N P
====================  ==========================  ===========================

:func:`zero_model_state_bytes` is the middle column, :func:`zero_bytes_per_step`
the right one for the ring algorithms, each layer's flat shard padded up to a
multiple of N as :mod:`minidist.parallel.data.zero` pads it; the tests compare
the second with the trace.
"""

from __future__ import annotations

import numpy as np


def _padded(numel: int, world_size: int) -> int:
    return -(-numel // world_size) * world_size


def zero_model_state_bytes(num_parameters: int, world_size: int, stage: int,
                           buffers: int = 0) -> float:
    """Bytes of model states per rank for fp32 training with Adam (4-byte
    weights, 4-byte gradients, two 4-byte moments), ``buffers`` bytes added::

        stage 0 (DDP):  16 psi
        stage 1:        (4 + 4 + 8 / N) psi         optimizer state sharded
        stage 2:        (4 + (4 + 8) / N) psi       + gradients sharded
        stage 3:        16 / N psi                  + parameters sharded

    (``psi`` parameters, N ranks; the padding to a multiple of N left out.)
    """
    psi, n = num_parameters, world_size
    if stage not in (0, 1, 2, 3) or n < 1:
        raise ValueError(f"zero_model_state_bytes: stage in 0..3 and world_size >= 1, "
                         f"got stage={stage!r}, world_size={world_size!r}")
    per_parameter = {0: 16, 1: 4 + 4 + 8 / n, 2: 4 + 12 / n, 3: 16 / n}[stage]
    return per_parameter * psi + buffers


def zero_bytes_per_step(numels, world_size: int, stage: int, itemsize: int = 4) -> dict:
    """Bytes one rank sends per training step, by collective, with the ring
    algorithms: ``{"all_reduce": ..., "reduce_scatter": ..., "all_gather": ...}``.

    ``numels``: the element count of each flat buffer (an int for one: stage 1's
    buffer; a list for FSDP's one buffer per layer), each padded up to a multiple
    of N: ``P = itemsize * sum(padded)``. A ring reduce_scatter or all_gather
    sends ``(N - 1) / N P``, a ring all_reduce (the two in a row) ``2 (N - 1) / N P``::

        stage 0 (DDP):  all_reduce 2 (N-1)/N P
        stage 1:        all_reduce 2 (N-1)/N P (DDP's) + all_gather (N-1)/N P
        stage 2:        reduce_scatter (N-1)/N P + all_gather (N-1)/N P
        stage 3:        reduce_scatter (N-1)/N P + all_gather 2 (N-1)/N P

    Stage 3 moves 1.5 times what DDP does; stages 1 and 2 the same (stage 1 as
    here, beside a full all_reduce: 1.5 times). The example count every step
    all-reduces (8 bytes) is left out.
    """
    if isinstance(numels, (int, np.integer)):
        numels = [numels]
    n = world_size
    one = sum(_padded(int(m), n) for m in numels) * itemsize * (n - 1) // n
    table = {0: (2, 0, 0), 1: (2, 0, 1), 2: (0, 1, 1), 3: (0, 1, 2)}
    if stage not in table:
        raise ValueError(f"zero_bytes_per_step: stage in 0..3, got {stage!r}")
    all_reduce, reduce_scatter, all_gather = table[stage]
    return {"all_reduce": all_reduce * one, "reduce_scatter": reduce_scatter * one,
            "all_gather": all_gather * one}


