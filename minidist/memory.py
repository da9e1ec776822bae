"""The memory ledger: the bytes one rank holds, by what they are for.

Training memory falls into five categories, and every strategy that fights
the memory wall (ZeRO, activation checkpointing, pipelining) moves bytes out
of one of them:

* ``parameters``      the weights (``param.data``);
* ``gradients``       their ``.grad`` arrays;
* ``optimizer_state`` momentum buffers, Adam's moments (``optimizer.state``);
* ``buffers``         communication buffers a strategy registers with
                      :meth:`Ledger.track` (a DDP bucket, a ZeRO shard);
* ``activations``     what the autograd graph keeps alive for backward: the
                      output of every node, the arrays its local backward
                      captured (:meth:`Tensor.saved_arrays`), and the inputs.

Measured, not computed from a formula: a sample walks the arrays that exist
at that moment and adds up their bytes. An array is counted by the memory it
keeps alive (a view keeps its whole base), and each byte once: when two
arrays share memory (a view and its base, a ``.grad`` that is a view into a
bucket, the same weight in two layers) it counts once, in the first category
of the order above that holds it.

Usage::

    ledger = memory.Ledger(model, optimizer, limit_bytes=64 << 20)
    loss = loss_fn(model(x), y)
    ledger.sample("forward", graph=loss)     # activations held by loss's graph
    loss.backward()
    ledger.sample("backward")
    optimizer.step()
    ledger.sample("step")
    ledger.report().peak_total              # the largest total of any sample

With tracing on, every sample is also a ``memory`` event in the trace (the
same keys as the pipeline's ledger: ``params grads optimizer activations``,
plus ``buffers``, ``total`` and ``peak``), so the visualiser can draw memory
over time per rank; :func:`memory_timeline` reads them back.

The cap. ``limit_bytes`` makes the ledger a per-rank memory limit: a sample
over it raises :class:`MemoryLimitError`, and :meth:`Ledger.check` refuses an
allocation before it is made, so a lesson can show a model that does not fit
under data parallelism but fits under ZeRO stage 3 without exhausting the
machine. This module knows nothing of processes: the rank comes from the
trace recorder when one is on, or from ``rank=``.

Per layer. :func:`layer_bytes` splits parameters, gradients and optimizer
state by layer (a GPT's blocks, its embeddings); :func:`layer_activation_bytes`
measures what one layer's graph keeps, with or without recomputation; and
:func:`transformer_block_activation_terms` is the formula for a transformer
block, term by term, among them attention's B H T^2 probabilities, the one
that grows with the square of the context: the course's one count of a
block's activations, on one rank or split by tensor and sequence
parallelism, which every cost function calls. :func:`activations_against_length`
puts formula and measurement side by side for several lengths
(tests/core/test_memory.py checks they agree to the byte).

Between the halves of a split backward (the zero-bubble pipelines' I and
W, :mod:`minidist.split_backward`) a stage holds, for W alone, the output
gradients of its deferred layers and the inputs their weight gradients
read: a sample counts them as activations with ``weights_pending=``, and
:func:`split_backward_bytes` measures them for a stage and an input.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy

from minidist import backend
from minidist import trace as _trace
from minidist.nn.recompute import ForwardState, checkpoint
from minidist.split_backward import WeightGradients, backward_input
from minidist.tensor import Tensor, graph_nodes

#: The categories, in the order that claims shared memory.
CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers", "activations")

#: The keys of a ``memory`` trace event (shared with the pipeline's ledger).
TRACE_KEYS = {"parameters": "params", "gradients": "grads", "optimizer_state": "optimizer",
              "buffers": "buffers", "activations": "activations"}


class MemoryLimitError(MemoryError):
    """A rank's ledger went, or would go, over its per-rank memory limit."""


@dataclass(frozen=True)
class Sample:
    """The bytes held at one moment, by category."""

    label: str
    time: int                      # trace.now() nanoseconds
    bytes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


@dataclass
class Report:
    """What the ledger saw: the latest sample, the peak of each category over
    all samples, the largest total and the sample that reached it."""

    current: dict[str, int]
    peak: dict[str, int]
    peak_total: int
    peak_label: str | None
    samples: list[Sample] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.current.values())


def _root(array):
    """The array that owns the memory ``array`` looks at (a view keeps its
    whole base alive)."""
    while getattr(array, "base", None) is not None and type(array.base) is type(array):
        array = array.base
    return array


def _extent(array):
    """(address space, first byte, one past the last byte) of the memory
    ``array`` keeps alive, or None for an empty array."""
    if isinstance(array, numpy.generic):  # a NumPy scalar (a full reduction's result)
        return ("scalar", id(array), id(array) + array.nbytes) if array.nbytes else None
    root = _root(array)
    if root.nbytes == 0:
        return None
    if isinstance(root, numpy.ndarray):
        low, high = numpy.lib.array_utils.byte_bounds(root)
        return ("host", low, high)
    pointer = root.data.ptr  # CuPy: device memory
    return (f"device{root.device.id}", pointer, pointer + root.nbytes)


def _merge(extents):
    merged = []
    for space, low, high in sorted(extents):
        if merged and merged[-1][0] == space and low <= merged[-1][2]:
            if high > merged[-1][2]:
                merged[-1] = (space, merged[-1][1], high)
        else:
            merged.append((space, low, high))
    return merged


def _size(merged) -> int:
    return sum(high - low for _, low, high in merged)


def count_bytes(by_category: dict[str, list]) -> dict[str, int]:
    """The bytes of each category's arrays, each byte counted once, in the
    first category of :data:`CATEGORIES` that holds it."""
    claimed: list = []
    result = {}
    for category in CATEGORIES:
        extents = [extent for array in by_category.get(category, ())
                   if (extent := _extent(array)) is not None]
        together = _merge(claimed + extents)
        result[category] = _size(together) - _size(claimed)
        claimed = together
    return result


def _as_array(value):
    return value.data if isinstance(value, Tensor) else value


def _is_array(value) -> bool:
    return isinstance(value, (numpy.ndarray, numpy.generic)) or type(value).__module__.startswith("cupy")


class Ledger:
    """Measures the bytes one rank holds, keeps every sample and the peak.

    ``model`` is a Module (its parameters are read at each sample, so a
    strategy that swaps them is followed) or a list of parameters;
    ``optimizer`` any minidist optimizer (its ``state`` is walked).
    ``limit_bytes`` caps the total (see :meth:`check`).
    """

    def __init__(self, model=None, optimizer=None, *, limit_bytes: int | None = None,
                 rank: int | None = None):
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"limit_bytes must be at least 0, got {limit_bytes}")
        if model is not None and not hasattr(model, "parameters"):
            model = list(model)
        self.model = model
        self.optimizer = optimizer
        self.limit_bytes = limit_bytes
        self._rank = rank
        self.samples: list[Sample] = []
        self._tracked: dict[str, list] = {category: [] for category in CATEGORIES}

    # ------------------------------------------------------------------ what is held

    @property
    def rank(self):
        if self._rank is not None:
            return self._rank
        recorder = _trace.current()
        return recorder.rank if recorder is not None else None

    def parameters(self) -> list[Tensor]:
        if self.model is None:
            return []
        return list(self.model.parameters()) if hasattr(self.model, "parameters") else self.model

    def track(self, category: str, array):
        """Count ``array`` (or a Tensor's data) in ``category`` for as long as
        it exists: the ledger holds it weakly, so a freed buffer drops out on
        its own. Returns ``array``. Strategies register their communication
        buffers here (``ledger.track("buffers", bucket)``)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; "
                             f"choose one of {', '.join(CATEGORIES)}")
        target = _as_array(array)
        if not _is_array(target):
            raise TypeError(f"track() takes an array or a Tensor, got {type(array).__name__}")
        try:
            reference = weakref.ref(target)
        except TypeError:  # an array type without weak references: held strongly
            reference = (lambda kept=target: kept)
        self._tracked[category].append(reference)
        return array

    def untrack(self, array) -> None:
        """Stop counting ``array`` (wherever it was tracked)."""
        target = _as_array(array)
        for category, references in self._tracked.items():
            self._tracked[category] = [ref for ref in references if ref() is not target]

    def arrays(self, graph=None, weights_pending=()) -> dict[str, list]:
        """The arrays of each category that exist now. ``graph``: a Tensor
        (or several) whose autograd graph's arrays count as activations.
        ``weights_pending``: split backwards whose weight half has not run
        (:class:`~minidist.split_backward.WeightGradients`, one or several):
        what each keeps for it counts as activations too."""
        found: dict[str, list] = {category: [] for category in CATEGORIES}
        parameters = self.parameters()
        found["parameters"] = [param.data for param in parameters]
        found["gradients"] = [param.grad for param in parameters if param.grad is not None]
        if self.optimizer is not None:
            for per_parameter in self.optimizer.state.values():
                found["optimizer_state"].extend(
                    _as_array(value) for value in per_parameter.values()
                    if _is_array(_as_array(value)))
        if graph is not None:
            roots = (graph,) if isinstance(graph, Tensor) else tuple(graph)
            for node in graph_nodes(*roots):
                found["activations"].append(node.data)
                found["activations"].extend(node.saved_arrays())
        if isinstance(weights_pending, WeightGradients):
            weights_pending = (weights_pending,)
        for pending in weights_pending:
            found["activations"].extend(pending.arrays())
        for category, references in self._tracked.items():
            alive = [(reference, reference()) for reference in references]
            self._tracked[category] = [reference for reference, array in alive
                                       if array is not None]
            found[category].extend(array for _, array in alive if array is not None)
        return found

    def measure(self, graph=None, weights_pending=()) -> dict[str, int]:
        """The bytes of each category now (nothing recorded)."""
        return count_bytes(self.arrays(graph, weights_pending))

    # ------------------------------------------------------------------ samples

    def sample(self, label: str = "", graph=None, weights_pending=()) -> Sample:
        """Measure, keep the sample (and so the peak), write a ``memory``
        event when tracing is on, and raise :class:`MemoryLimitError` if the
        total is over ``limit_bytes`` (after recording, so the trace shows it)."""
        measured = Sample(label, _trace.now(), self.measure(graph, weights_pending))
        self.samples.append(measured)
        if _trace.enabled():
            peak = max(sample.total for sample in self.samples)
            _trace.record("memory", measured.time, measured.time, nbytes=measured.total,
                          label=memory_label(label, measured.bytes, peak))
        if self.limit_bytes is not None and measured.total > self.limit_bytes:
            raise MemoryLimitError(self._over_limit(f"at {label!r}" if label else "",
                                                    measured.bytes, 0))
        return measured

    def check(self, nbytes: int, what: str = "an allocation") -> None:
        """Refuse, before it is made, an allocation of ``nbytes`` that would
        take this rank over ``limit_bytes``: call it before allocating a big
        array, so a model that does not fit fails clearly instead of
        exhausting the machine."""
        if self.limit_bytes is None:
            return
        held = self.measure()
        if sum(held.values()) + nbytes > self.limit_bytes:
            raise MemoryLimitError(self._over_limit(f"allocating {what} ({nbytes:,} bytes)",
                                                    held, nbytes))

    def _over_limit(self, where: str, held: dict[str, int], extra: int) -> str:
        total = sum(held.values()) + extra
        rank = self.rank
        who = f"rank {rank}" if rank is not None else "this process"
        largest = max(held, key=held.get)
        parts = ", ".join(f"{category} {held[category]:,}" for category in CATEGORIES)
        return (f"{who}: {where + ': ' if where else ''}{total:,} bytes would be held, over "
                f"the per-rank memory limit of {self.limit_bytes:,} bytes ({parts}). The "
                f"largest is {largest}: shard it across ranks (ZeRO shards optimizer state, "
                f"gradients and parameters), keep fewer activations (a smaller batch, "
                f"checkpointing), or raise limit_bytes.")

    def report(self) -> Report:
        """The latest sample, each category's peak and the largest total."""
        if not self.samples:
            zeros = dict.fromkeys(CATEGORIES, 0)
            return Report(dict(zeros), dict(zeros), 0, None, [])
        peak = {category: max(sample.bytes[category] for sample in self.samples)
                for category in CATEGORIES}
        top = max(self.samples, key=lambda sample: sample.total)
        return Report(dict(self.samples[-1].bytes), peak, top.total, top.label,
                      list(self.samples))


# ---------------------------------------------------------------------- the trace


def memory_label(label: str, held: dict[str, int], peak: int | None = None) -> str:
    """The label of a ``memory`` event: ``memory <label> #params=... grads=...``."""
    text = f"memory {label}".strip().replace(" #", " ")
    pairs = {TRACE_KEYS[category]: held.get(category, 0) for category in CATEGORIES}
    pairs["total"] = sum(held.values())
    pairs["peak"] = peak
    return _trace.with_info(text, **pairs)


def memory_timeline(events) -> dict[int, list[tuple[int, dict[str, int]]]]:
    """Per rank, the ``memory`` events in time order as (time, bytes by
    category): what a memory-over-time chart draws. Reads the pipeline's
    ledger events too (their missing categories read as 0)."""
    timeline: dict[int, list] = {}
    for event in sorted((event for event in events if event.get("kind") == "memory"),
                        key=lambda event: (event["rank"], event["start"])):
        info = _trace.label_info(event.get("label") or "")
        held = {category: int(info.get(key, 0) or 0) for category, key in TRACE_KEYS.items()}
        timeline.setdefault(event["rank"], []).append((event["start"], held))
    return timeline


# ---------------------------------------------------------------------- per layer


def layer_bytes(layers, optimizer=None) -> dict[str, dict[str, int]]:
    """Parameters, gradients and optimizer state of each layer: ``layers`` is
    {name: Module} (a GPT's ``transformer.h`` blocks, its embeddings, ...),
    ``optimizer`` the one stepping them (its state is matched to each
    layer's parameters). A parameter shared by two layers (a tied weight)
    counts in the first that holds it. Activations per layer are
    :func:`layer_activation_bytes`'s."""
    index_of = {}
    if optimizer is not None:
        for index, param, _ in optimizer._indexed_params():
            index_of[id(param)] = index
    table, seen = {}, set()
    for name, layer in layers.items():
        parameters = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in parameters)
        state = []
        if optimizer is not None:
            for param in parameters:
                per_parameter = optimizer.state.get(index_of.get(id(param)), {})
                state.extend(_as_array(value) for value in per_parameter.values()
                             if _is_array(_as_array(value)))
        held = count_bytes({"parameters": [p.data for p in parameters],
                            "gradients": [p.grad for p in parameters if p.grad is not None],
                            "optimizer_state": state})
        table[name] = {category: held[category]
                       for category in ("parameters", "gradients", "optimizer_state")}
    return table


def layer_activation_bytes(layer, x, recompute: bool = False) -> int:
    """Measured: the bytes ``layer``'s autograd graph keeps for the backward
    after ``layer(x)``, from its input (left out: the layer before holds it)
    to its output (counted: the layer after reads it). ``recompute=True``
    runs it through :func:`minidist.nn.checkpoint`, which keeps only the
    input and the output and recomputes the rest in the backward."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    if not x.requires_grad:
        x = Tensor(x.data, requires_grad=True)
    out = checkpoint(layer, x) if recompute else layer(x)
    ledger = Ledger(layer)
    return ledger.measure(graph=out)["activations"] - count_bytes({"activations": [x.data]})["activations"]


def split_backward_bytes(stage, x, gradient=None) -> dict[str, int]:
    """Measured: what a pipeline stage holds for its backward, after its
    forward and between the two halves of a split backward
    (:mod:`minidist.split_backward`, the zero-bubble schedules' I and W).

    Runs ``stage(x)`` (``x`` floating: as a leaf that requires a gradient,
    the stage's input activation; integer token ids: as they are, a first
    stage), measures the activations its graph keeps (``"forward"``, the
    input and the output included), runs the input half with ``gradient``
    (ones of the output's shape when None; a scalar loss takes none), and
    measures what the weight half keeps (``"weights_pending"``: the output
    gradients of the deferred layers and their saved inputs, what
    :attr:`WeightGradients.nbytes` counts, the parameters left out). The
    weight half is not run: the stage's ``.grad`` are left as they were,
    and its buffers and random generators too (the forward runs as a
    replay, :class:`ForwardState`)."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    floating = numpy.issubdtype(numpy.dtype(x.dtype), numpy.floating)
    start = Tensor(x.data, requires_grad=True) if floating else x
    ledger = Ledger(stage)
    with ForwardState(stage).replay():
        out = stage(start)
    after_forward = ledger.measure(graph=out)["activations"]
    if gradient is None and out.data.size != 1:
        gradient = backend.of(out.data).ones_like(out.data)
    pending = backward_input(out, gradient, inputs=[start] if floating else [])
    between = ledger.measure(weights_pending=pending)["activations"]
    return {"forward": after_forward, "weights_pending": between}


def transformer_block_activation_terms(batch: int, seq_len: int, n_embd: int, n_head: int,
                                       itemsize: int = 4, recompute: bool = False,
                                       mlp_ratio: int = 4, tp: int = 1,
                                       sequence_parallel: bool = False) -> dict[str, int]:
    """The course's one count of activation memory: the bytes one transformer
    block (one layer: a GPT's pre-LayerNorm :class:`~minidist.models.gpt.Block`)
    keeps for the backward, term by term, on one rank. Every lesson and cost
    function that counts a block's activations calls it (lessons 16-18,
    :func:`~minidist.parallel.tensor.costs.gpt_activation_bytes`, the 3D
    planner's :meth:`~minidist.parallel.mesh.plan_inputs.GPTShape.layer_activation_bytes`).

    Symbols as in lessons/NOTATION.md: B sequences of T positions, width d,
    H heads, s bytes per value (``itemsize``: 4 in float32, 2 in float16 /
    bfloat16), n the tensor-parallel ranks (``tp``). The assumptions:

    * what is kept is what minidist's NumPy ops keep alive in the autograd
      graph after the forward (every node's output and what each local
      backward captured, each byte once), as the memory ledger measures it;
      the block's input is not counted (the block before holds it), its
      output is;
    * every value is s bytes: inside a block minidist keeps no masks or
      integer arrays, and its GPT has no dropout;
    * the attention is the plain one: it keeps the probabilities P, B H T^2
      values (the scores are freed once P is made), the one term that grows
      with the square of the context. FlashAttention or ring attention keep
      no P; this count does.

    Per block, in values (times s for bytes), on one rank (n = 1):

    * two LayerNorms: each its output and x_hat (2 B T d) and 1/std (B T);
    * attention: q, k, v from ``c_attn`` (3 B T d; the heads are views of
      it), P (B H T^2), the heads' output (B T d) and its copy back to
      (B, T, d) (B T d; none with one head: then the reshape is a view);
    * MLP: ``c_fc``'s output (4 B T d), GELU's output and its Phi(x)
      (8 B T d);
    * the two ``c_proj`` row layers: each its output, the bias added in the
      product (B T d);
    * the two residual sums (2 B T d), the second the block's output;

    25 B T d + 2 B T + B H T^2 values in all. Split over n >= 2 tensor-
    parallel ranks (lesson 17, :mod:`minidist.parallel.tensor.gpt`): q, k,
    v, P, the heads' output and copy, the MLP's arrays are divided by n (a
    rank holds H/n heads and 4d/n hidden units; the copy is a view when H/n
    = 1), and each row layer keeps three whole arrays instead of one: its
    partial product, the all_reduce's summed copy, the bias added:

        B T d (12 + 17/n) + 2 B T + B H T^2 / n       (16/n for 17/n when H/n = 1)

    With sequence parallelism (n >= 2) the LayerNorms, the summed copy (now
    the reduce_scatter's T/n positions), the biases and the residual sums
    are divided by n too; what stays whole is the column layers' gathered
    input (2 B T d, kept for their weight gradient) and the row layers'
    partial products (2 B T d):

        B T d (4 + 27/n) + 2 B T / n + B H T^2 / n     (26/n when H/n = 1)

    With ``recompute`` (the block run through :func:`minidist.nn.checkpoint`)
    it keeps its output only, B T d (B T d / n with sequence parallelism):
    the rest, P included, is rebuilt in the backward, one block at a time.

    Measured: tests/core/test_memory.py holds the count to the ledger byte
    for byte on one rank, with and without recomputation, in float32 and
    float64; tests/parallel/test_tensor_parallel_gpt.py on 2 and 4 ranks,
    with and without sequence parallelism. (Recomputation on split ranks is
    the same rule, not measured.)

    Megatron's kernels keep less: Korthikanti et al. ("Reducing Activation
    Recomputation in Large Transformer Models", 2022) count 34 B T d + 5 B H
    T^2 bytes a layer in 2-byte values with dropout (fused kernels keep
    GELU's input only, a byte per dropout mask); the shape is the same: a
    part linear in T, part of it divided by n, and the B H T^2 term."""
    n = tp
    if n < 1 or (sequence_parallel and n < 2):
        raise ValueError(f"transformer_block_activation_terms: tp={tp} with "
                         f"sequence_parallel={sequence_parallel}: tp must be >= 1, and >= 2 "
                         "for sequence parallelism")
    if n_head % n or (sequence_parallel and seq_len % n):
        raise ValueError(f"transformer_block_activation_terms: tp={n} must divide the "
                         f"{n_head} heads" + (f" and the {seq_len} positions"
                                              if sequence_parallel else ""))
    s = itemsize
    btd, bt = batch * seq_len * n_embd, batch * seq_len
    if recompute:
        return {"output (the next block's checkpointed input)":
                (btd // n if sequence_parallel else btd) * s}
    hidden = mlp_ratio * btd
    copy = btd // n if n_head // n > 1 else 0
    local = n if sequence_parallel else 1          # what the sequence split divides
    terms = {
        "layer norms: outputs, x_hat, 1/std": 2 * (2 * btd + bt) // local,
        "attention: q, k, v": 3 * btd // n,
        "attention: probabilities P (B H T T)": batch * n_head * seq_len * seq_len // n,
        "attention: heads' output, its (B, T, d) copy": btd // n + copy,
        "mlp: c_fc, GELU and Phi(x)": 3 * hidden // n,
    }
    if n == 1:
        terms["row layers (c_proj): outputs"] = 2 * btd
    else:
        if sequence_parallel:
            terms["column layers: gathered inputs"] = 2 * btd
        terms["row layers (c_proj): partial products"] = 2 * btd
        terms["row layers: summed copies" + (" (T/n positions)" if sequence_parallel else "")] = \
            2 * btd // local
        terms["row layers: bias added"] = 2 * btd // local
    terms["residual sums"] = 2 * btd // local
    return {name: values * s for name, values in terms.items()}


def transformer_block_activation_bytes(batch: int, seq_len: int, n_embd: int, n_head: int,
                                       itemsize: int = 4, recompute: bool = False,
                                       tp: int = 1, sequence_parallel: bool = False) -> int:
    """The sum of :func:`transformer_block_activation_terms`: one block's
    activation bytes on one rank, P included."""
    return sum(transformer_block_activation_terms(batch, seq_len, n_embd, n_head, itemsize,
                                                  recompute, tp=tp,
                                                  sequence_parallel=sequence_parallel).values())


def activations_against_length(make_block, n_embd: int, n_head: int, batch: int, seq_lens,
                               dtype=numpy.float32, seed: int = 0) -> list[dict]:
    """Activation bytes of one transformer block against the sequence length,
    formula and measured, without and with recomputation: one row per T of
    ``seq_lens`` with ``T``, ``formula``, ``measured``, ``attention_scores``
    (the B H T^2 term alone), ``formula_recompute`` and ``measured_recompute``.
    ``make_block()`` builds the block (e.g. ``lambda: Block(config)`` of
    :mod:`minidist.models.gpt`); it is run on random (B, T, d) inputs."""
    block = make_block()
    itemsize = numpy.dtype(dtype).itemsize
    rng = numpy.random.default_rng(seed)
    rows = []
    for steps in seq_lens:
        x = rng.standard_normal((batch, steps, n_embd)).astype(dtype)
        terms = transformer_block_activation_terms(batch, steps, n_embd, n_head, itemsize)
        rows.append({
            "T": steps,
            "formula": sum(terms.values()),
            "measured": layer_activation_bytes(block, x),
            "attention_scores": terms["attention: probabilities P (B H T T)"],
            "formula_recompute": transformer_block_activation_bytes(batch, steps, n_embd, n_head,
                                                                    itemsize, recompute=True),
            "measured_recompute": layer_activation_bytes(block, x, recompute=True),
        })
    return rows
