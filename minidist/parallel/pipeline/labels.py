"""The words a pipeline writes into its trace: what a compute region, a
message and a step are called, so the runtime, the simulator and the
drawings in ``viz/`` read them the same way ("F3" forward of micro-batch 3,
"F3c1" its forward on the rank's model chunk 1, ...).
"""

from __future__ import annotations

from minidist import trace as _trace


def compute_text(letter: str, microbatch: int, chunk: int = 0) -> str:
    """How a forward, backward or recomputation is written everywhere (the
    schedule's printout, the trace, the drawings): ``F3``, ``B3``, ``R3``;
    ``F3c1`` on the rank's model chunk 1 (interleaved)."""
    return f"{letter}{microbatch}" + (f"c{chunk}" if chunk else "")


def compute_label(letter: str, microbatch: int, chunk: int, stage: int, phase: str) -> str:
    """A compute region's label: ``F3`` / ``B3`` / ``R3`` with its pairs
    (the chunk is among the pairs, not in the text: the agreed format)."""
    return _trace.with_info(f"{letter}{microbatch}", pipeline=letter, mb=microbatch,
                            chunk=chunk, stage=stage, phase=phase)


def step_label(stage: int) -> str:
    return _trace.with_info("step", pipeline="step", stage=stage)


def message_label(kind: str, microbatch: int) -> str:
    """``kind`` is "act" or "grad"."""
    return _trace.with_info(f"{kind} mb={microbatch}", pipeline=kind, mb=microbatch)


def memory_label(stage: int, params: int, grads: int, optimizer: int, activations: int,
                 live_microbatches: int, weights_pending: int | None = None,
                 weights_pending_bytes: int | None = None) -> str:
    """A memory event's label. With a split backward, ``weights_pending``
    counts the (micro-batch, chunk) pieces whose input half I has run and
    whose weight half W has not, and ``weights_pending_bytes`` what they keep
    for W (included in ``activations``); schedules without a split leave
    both out."""
    pairs = dict(params=params, grads=grads, optimizer=optimizer, activations=activations,
                 live_microbatches=live_microbatches, stage=stage)
    if weights_pending is not None:
        pairs["weights_pending"] = weights_pending
    if weights_pending_bytes is not None:
        pairs["weights_pending_bytes"] = weights_pending_bytes
    return _trace.with_info("memory", **pairs)


