"""What a 3D plan's prediction is given: the model, the machine, the plan.

Three frozen shapes, each a handful of numbers that :mod:`.plan_3d` turns
into one step's time and memory:

* :class:`GPTShape`: the GPT's shape and its batch, with the counts the
  prediction reads off it: the parameters (all, and one block's on one of
  t ranks), the FLOPs of a token, the bytes a layer (one block) keeps for
  backward (:func:`minidist.memory.transformer_block_activation_bytes`, the
  course's one count);
* :class:`Machine`: a rank's FLOP/s and the links within and between nodes
  (:data:`CLUSTER`: a GPU cluster of today, its constants chosen);
* :class:`Plan`: the mesh dp x tp x pp and how it runs (schedule, sequence
  parallelism, ZeRO's stage, recomputation); :func:`why_not` says why a
  plan cannot split a model.

The formulas (the notation, the FLOPs, the activations' bytes) are
:mod:`.plan_3d`'s. Costs: every count a few multiplications.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.alpha_beta import Params
from minidist.memory import transformer_block_activation_bytes

#: ZeRO's collectives on the dp group, per stage, as :mod:`minidist.parallel.data.zero` makes them.
ZERO_COLLECTIVES = {
    0: ("all_reduce",),
    1: ("all_reduce", "all_gather"),
    2: ("reduce_scatter", "all_gather"),
    3: ("reduce_scatter", "all_gather", "all_gather"),
}


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class GPTShape:
    """What the prediction needs of a GPT (:class:`minidist.models.gpt.GPT`'s
    shape) and of its batch: ``global_batch`` sequences of ``seq_len``
    tokens per step, ``micro_batch`` sequences per pipeline micro-batch;
    ``block_size`` rows of position embedding (default: ``seq_len``)."""

    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int
    global_batch: int
    micro_batch: int = 1
    bias: bool = True
    block_size: int | None = None

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len", "global_batch",
                     "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTShape: {name} must be a positive int, got {value!r}")
        if self.block_size is not None and not (
                isinstance(self.block_size, int) and self.block_size >= self.seq_len):
            raise ValueError(f"GPTShape: block_size must be an int >= seq_len={self.seq_len} "
                             f"(the positions a sequence uses), got {self.block_size!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTShape: n_embd={self.n_embd} must be a multiple of "
                             f"n_head={self.n_head}")

    @classmethod
    def from_config(cls, config, global_batch: int, micro_batch: int = 1,
                    seq_len: int | None = None) -> GPTShape:
        """The shape of a :class:`~minidist.models.gpt.GPTConfig`'s model, trained
        on windows of ``seq_len`` tokens (default: its ``block_size``)."""
        return cls(config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                   seq_len or config.block_size, global_batch, micro_batch, config.bias,
                   config.block_size)

    @property
    def positions(self) -> int:
        """Rows of the position embedding."""
        return self.seq_len if self.block_size is None else self.block_size

    def block_parameters(self, tp: int = 1) -> int:
        """One block's parameters on one of ``tp`` ranks: 12 h^2 / t + 7 h / t + 6 h
        with biases (c_attn's and c_fc's weights and biases, c_proj's weights
        split; the c_proj biases and the two LayerNorms whole); 12 h^2 / t + 2 h
        without."""
        h = self.n_embd
        if self.bias:
            return (12 * h * h + 7 * h) // tp + 6 * h
        return 12 * h * h // tp + 2 * h

    def parameters(self) -> int:
        """All parameters, the tied embedding once (``GPT.num_parameters()``)."""
        h = self.n_embd
        final_norm = 2 * h if self.bias else h
        return (self.n_layer * self.block_parameters() + self.vocab_size * h
                + self.positions * h + final_norm)

    def matmul_parameters(self) -> int:
        """N_mm = 12 L h^2 + V h: the weights that multiply every token."""
        return 12 * self.n_layer * self.n_embd ** 2 + self.vocab_size * self.n_embd

    def forward_flops_per_token(self) -> float:
        """2 N_mm + 4 L s h."""
        return 2 * self.matmul_parameters() + 4 * self.n_layer * self.seq_len * self.n_embd

    def step_flops(self, recompute: bool = False) -> float:
        """FLOPs of one step on the whole global batch: 3 (4 with
        recomputation) forwards' worth per token."""
        passes = 4 if recompute else 3
        return passes * self.forward_flops_per_token() * self.global_batch * self.seq_len

    def layer_activation_bytes(self, tp: int = 1, sequence_parallel: bool = False,
                               recompute: bool = False, itemsize: int = 2) -> int:
        """Bytes one layer (one block) keeps for backward on one micro-batch,
        on one of ``tp`` ranks, the attention probabilities included: the
        course's one count, :func:`minidist.memory.transformer_block_activation_bytes`
        (``itemsize`` 2: bf16 activations); with ``recompute``, only its
        output, the next layer's input."""
        return transformer_block_activation_bytes(
            self.micro_batch, self.seq_len, self.n_embd, self.n_head, itemsize, recompute,
            tp=tp, sequence_parallel=sequence_parallel and tp > 1)


# --------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Machine:
    """``flops``: FLOP/s one rank sustains on the model's matrix products;
    ``intra``: the link between ranks of one node; ``inter``: between nodes;
    ``node_size`` ranks per node."""

    flops: float
    intra: Params
    inter: Params
    node_size: int = 8

    def link(self, span: int) -> Params:
        """The link of a group whose ranks lie within ``span`` consecutive ranks."""
        return self.intra if span <= self.node_size else self.inter

    def link_name(self, span: int) -> str:
        return "intra-node" if span <= self.node_size else "inter-node"


#: A GPU cluster of today, its constants chosen, not measured (they are the
#: arguments below): a rank sustains an H100's bf16 at about 40 % of its
#: peak; NVLink joins the 8 ranks of a node, one InfiniBand port per GPU the
#: nodes; links full duplex; reductions free (gamma 0: a GPU adds faster than
#: a link brings the bytes).
CLUSTER = Machine(flops=400e12,
                  intra=Params(alpha=5e-6, beta=1 / 200e9),
                  inter=Params(alpha=10e-6, beta=1 / 25e9),
                  node_size=8)


# --------------------------------------------------------------------------- a plan


@dataclass(frozen=True)
class Plan:
    """A mesh ``dp x tp x pp`` and how it runs: the pipeline ``schedule``
    ("1f1b", "gpipe", "interleaved_1f1b") with ``virtual_stages`` chunks,
    Megatron's ``sequence_parallel``, ZeRO's ``zero_stage`` on dp, full
    activation ``recompute``."""

    dp: int
    tp: int
    pp: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    recompute: bool = False

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        extras = [name for name, on in (("sp", self.sequence_parallel),
                                         (f"zero{self.zero_stage}", self.zero_stage),
                                         ("recompute", self.recompute),
                                         (f"v{self.virtual_stages}", self.virtual_stages > 1))
                  if on]
        return f"dp{self.dp} tp{self.tp} pp{self.pp}" + "".join(f" {x}" for x in extras)


def why_not(model: GPTShape, plan: Plan) -> str | None:
    """Why ``plan`` cannot split ``model`` (None when it can)."""
    for name in ("dp", "tp", "pp", "virtual_stages"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be a positive int, got {value!r}"
    if plan.zero_stage not in ZERO_COLLECTIVES:
        return f"zero_stage must be 0, 1, 2 or 3, got {plan.zero_stage!r}"
    if model.n_head % plan.tp:
        return f"tp={plan.tp} does not divide the {model.n_head} heads"
    if plan.sequence_parallel and model.seq_len % plan.tp:
        return f"sequence parallelism: tp={plan.tp} does not divide seq_len={model.seq_len}"
    pieces = plan.pp * plan.virtual_stages
    if model.n_layer % pieces:
        return f"pp x virtual_stages = {pieces} does not divide the {model.n_layer} layers"
    if model.global_batch % (plan.dp * model.micro_batch):
        return (f"dp x micro_batch = {plan.dp} x {model.micro_batch} does not divide the "
                f"global batch of {model.global_batch} sequences")
    return None

