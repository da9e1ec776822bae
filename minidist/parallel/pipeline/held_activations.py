"""What a pipeline stage keeps between a micro-batch's forward and its
backward, with or without recomputation.

A backward needs what its forward computed: the graph from the stage's
output back to its input (every layer's output, and what the layers'
backward closures hold) and, on the last stage, the loss. A rank keeps one
such record per (micro-batch, chunk), from the forward to its backward; how
many at once is the schedule's doing (GPipe all m, 1F1B at most p - s at
stage s).

* **Kept** (``recompute=False``): the forward records its graph and keeps
  all of it. Memory per held micro-batch: the stage's input and every
  layer's output.
* **Recomputed** (``recompute=True``, GPipe's re-materialisation): the
  forward runs under ``no_grad`` and keeps only the stage's input and a
  :class:`~minidist.nn.recompute.ForwardState` (the random generators'
  states before it). Just before the backward,
  :meth:`HeldActivations.recompute` runs the forward again from that input,
  recording the graph; the replay draws the same Dropout masks and leaves
  BatchNorm's statistics updated once, so the gradients are the same bits.
  Memory per held micro-batch: the stage's input (the rest only while its
  backward runs), for one more forward per micro-batch and stage (about f
  more, f being the stage's forward time).

With the backward split in two (zero-bubble schedules), the input half I
frees the forward's record and leaves what the weight half W still needs:
the split backward's pending weights, kept here from I to W
(:meth:`HeldActivations.keep_for_weights`, :meth:`HeldActivations.take_for_weights`).
Memory per pending piece: ``pending.nbytes`` (the layers' inputs and output
gradients that the weights' gradients are made of), until its W runs.

``nbytes`` counts the input and each layer's output, the activations the
memory ledger reports; ``weights_pending_bytes`` what waits for W.
"""

from __future__ import annotations

from minidist import nn
from minidist.nn.recompute import ForwardState
from minidist.tensor import Tensor, no_grad


def run_layers(module, inputs: Tensor) -> tuple[Tensor, int]:
    """``module(inputs)`` and the bytes of every layer output the backward keeps."""
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    kept, current = 0, inputs
    for layer in layers:
        current = layer(current)
        kept += current.data.nbytes
    return current, kept


class Held:
    """What one forward left for its backward: its input, its output and loss
    (the loss on the last stage only; neither while recomputation is due),
    the bytes held, and the replay of a recomputed forward."""

    __slots__ = ("inputs", "outputs", "loss", "nbytes", "replay")

    def __init__(self, inputs, outputs, loss, nbytes, replay=None):
        self.inputs, self.outputs, self.loss, self.nbytes = inputs, outputs, loss, nbytes
        self.replay = replay


class HeldActivations:
    """This rank's :class:`Held` records, by (micro-batch, chunk).

    ``chunks`` are the rank's model chunks; ``recompute`` keeps only each
    forward's input. ``loss_of``, passed on the last stage (None elsewhere),
    turns a chunk's output and its micro-batch into the loss to backpropagate."""

    def __init__(self, chunks, recompute: bool):
        self.chunks = chunks
        self.recomputing = recompute
        self._held: dict[tuple[int, int], Held] = {}
        # (micro-batch, chunk) -> the split backward's pending weight half
        self._weights: dict = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key) -> bool:
        return key in self._held

    def __iter__(self):
        return iter(self._held)

    @property
    def nbytes(self) -> int:
        return sum(held.nbytes for held in self._held.values())

    def forward(self, key, inputs: Tensor, loss_of=None):
        """Run chunk ``key[1]`` on ``inputs`` and keep what its backward
        needs; the output and the loss (None without ``loss_of``)."""
        microbatch, chunk = key
        module = self.chunks[chunk]
        if self.recomputing:
            replay = ForwardState(module)
            with no_grad():
                outputs, _ = run_layers(module, inputs)
                loss = loss_of(outputs, microbatch) if loss_of is not None else None
            self._held[key] = Held(inputs, None, loss, inputs.data.nbytes, replay)
        else:
            outputs, kept = run_layers(module, inputs)
            loss = loss_of(outputs, microbatch) if loss_of is not None else None
            self._held[key] = Held(inputs, outputs, loss, kept + inputs.data.nbytes)
        return outputs, loss

    def recompute(self, key, loss_of=None) -> None:
        """Run the forward of ``key`` again from its kept input, recording
        its graph this time, with the first forward's random draws."""
        microbatch, chunk = key
        held = self._held[key]
        inputs = Tensor(held.inputs.data, requires_grad=held.inputs.requires_grad)
        with held.replay.replay():
            outputs, kept = run_layers(self.chunks[chunk], inputs)
        held.inputs, held.outputs = inputs, outputs
        held.loss = loss_of(outputs, microbatch) if loss_of is not None else None
        held.nbytes += kept

    def pop(self, key) -> Held:
        """What the forward of ``key`` left, no longer held (its backward runs)."""
        return self._held.pop(key)

    # ------------------------------------------------------------------ from I to W

    def keep_for_weights(self, key, pending) -> None:
        """Keep the split backward's ``pending`` weight half of ``key`` (its I has run)."""
        self._weights[key] = pending

    def take_for_weights(self, key):
        """The pending weight half of ``key``, no longer held (its W runs), or None."""
        return self._weights.pop(key, None)

    @property
    def weights_pending(self) -> list:
        """The (micro-batch, chunk) pieces whose I has run and whose W has not."""
        return sorted(self._weights)

    @property
    def weights_pending_bytes(self) -> int:
        return sum(pending.nbytes for pending in self._weights.values())
