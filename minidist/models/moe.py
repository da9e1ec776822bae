"""A mixture of experts: E MLPs where the GPT has one, each token sent to k of them.

The feed-forward layer holds most of a transformer's parameters and does
most of its work per token. A mixture-of-experts layer (Shazeer et al.,
2017; GShard, Lepikhin et al., 2020; Switch Transformer, Fedus et al., 2021)
keeps E of them, the *experts* (each the GPT's MLP, C -> 4C -> GELU -> C),
and a *router* that picks, for every token, the k experts it goes to: E
times the parameters, about k times the flops of one MLP.

For the N tokens of one call (the rows of x, (N, C)):

1. **Router**: ``probs = softmax(x W_r^T)``, (N, E) (``router``, a Linear
   without bias). Each token's *choices* are its k most probable experts,
   first choice first (ties to the lower index).
2. **Gates**: k = 1 takes Switch's gate, the probability p of the chosen
   expert itself (normalised it would be 1, and the router would get no
   gradient from the output); k >= 2 takes GShard's, the k probabilities
   divided by their sum (Mixtral's softmax over the top k is the same).
3. **Capacity**: every expert takes at most
   ``capacity = ceil(k N / E * capacity_factor)`` tokens, so its work (and,
   spread over ranks, its buffer) has a bound. Places go first choices
   first, in token order, then second choices (GShard's priority); a choice
   that finds its expert full is *dropped*. A token with every choice
   dropped gets nothing from the layer: in the block, ``x + moe(ln_2(x))``,
   its output is the residual alone. ``capacity_factor=None``: no limit
   (the one way to say it: an infinite factor is refused, as are 0, NaN and
   negative ones).
4. **Experts**: each expert runs on the rows of its kept choices (an empty
   set of rows too: its gradient is then zero, as an idle replica's).
5. **Combine**: ``y[t] = sum over t's kept choices of gate * expert(x[t])``,
   a scatter-add of rows (:func:`index_add_rows`).
6. **Auxiliary load-balancing loss** (Switch's): ``E * sum_i f_i P_i`` with
   f_i the fraction of the k N choices that name expert i (before capacity;
   for k = 1 Switch's fraction of tokens) and P_i the router's mean
   probability of expert i. It is 1 when both are uniform and grows as the
   router favours a few experts; f is counted, not differentiated, so the
   gradient flows through P into the router. A model adds it to its loss
   with a small coefficient (``aux_loss_coef``, Switch's 0.01).

Every call is one capacity group: the tokens given are the ones that compete
for places (GShard's groups; under expert parallelism each rank's tokens,
:mod:`minidist.parallel.expert.dispatch`). Steps 1 to 3 are bookkeeping on
arrays (:func:`route`, whose :class:`Routing` the layer keeps as
``self.routing`` for inspection and pictures); the gradient flows through the
gathered probabilities (the gates), the row gathers and the scatter-add.

Cost per token, forward: 2 C E flops in the router and about 16 C^2 k in the
experts (the MLP's 16 C^2 for each kept choice); parameters E (8 C^2 + 5 C)
+ C E. Memory: the k N gathered rows and the experts' activations on them.

:class:`MoEGPT` is the GPT of :mod:`minidist.models.gpt` with this layer in
place of every block's MLP (:class:`MoEGPTConfig` adds ``n_expert``,
``top_k``, ``capacity_factor``, ``aux_loss_coef``); gpt.py is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy

from minidist import backend
from minidist.models.gpt import GPT, MLP, GPTConfig
from minidist.nn import Linear, Module, ModuleList, init
from minidist.nn import functional as F
from minidist.tensor import Tensor, concatenate


@dataclass(frozen=True)
class MoEGPTConfig(GPTConfig):
    """A :class:`~minidist.models.gpt.GPTConfig` with mixture-of-experts
    blocks: ``n_expert`` experts per block, each token routed to ``top_k``
    (1: Switch, 2: GShard) of them, each expert taking at most
    ``ceil(top_k * tokens / n_expert * capacity_factor)`` tokens of a call
    (None: no limit), and the load-balancing loss added with weight
    ``aux_loss_coef``."""

    n_expert: int = 4
    top_k: int = 1
    capacity_factor: float | None = 1.25
    aux_loss_coef: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        check_moe_shape(self.n_expert, self.top_k, self.capacity_factor)


def check_moe_shape(n_expert, top_k, capacity_factor) -> None:
    """Refuse an expert count, k or capacity factor that cannot route, saying why."""
    if not isinstance(n_expert, (int, numpy.integer)) or n_expert < 1:
        raise ValueError(f"MoE: n_expert must be a positive int, got {n_expert!r}")
    if not isinstance(top_k, (int, numpy.integer)) or not 1 <= top_k <= n_expert:
        raise ValueError(f"MoE: top_k must be an int from 1 to n_expert={n_expert} (the experts "
                         f"each token goes to), got {top_k!r}")
    # One spelling of "no limit": None. An infinite factor would make an
    # infinite capacity, which ceil() cannot turn into a count of places.
    real = isinstance(capacity_factor, (int, float, numpy.integer, numpy.floating)) \
        and not isinstance(capacity_factor, bool)
    if capacity_factor is not None and not (real and 0 < capacity_factor < math.inf):
        raise ValueError(f"MoE: capacity_factor must be a positive finite number, or None for no "
                         f"limit, got {capacity_factor!r}; 1.0 gives each expert its even share "
                         "of tokens")


def expert_capacity(tokens: int, n_expert: int, top_k: int, capacity_factor) -> int:
    """``ceil(k N / E * capacity_factor)``: places per expert for ``tokens``
    tokens (all of them with no factor). Cost: O(1)."""
    if capacity_factor is None:
        return tokens
    return math.ceil(top_k * tokens * capacity_factor / n_expert)


@dataclass(frozen=True)
class Routing:
    """Where one call's tokens went (arrays; nothing here has a gradient).

    ``choices`` (N, k): the experts of each token, first choice first;
    ``kept`` (N, k): whether that choice found a place; ``slot`` (N, k): its
    place in the expert's buffer (the count of earlier choices of that
    expert; kept when below ``capacity``); ``n_expert``, ``capacity``.
    """

    choices: numpy.ndarray
    kept: numpy.ndarray
    slot: numpy.ndarray
    n_expert: int
    capacity: int

    @property
    def tokens(self) -> int:
        return int(self.choices.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.choices.shape[1])

    @property
    def routed(self) -> numpy.ndarray:
        """Choices naming each expert, before capacity, (E,)."""
        return numpy.bincount(self.choices.reshape(-1), minlength=self.n_expert)

    @property
    def load(self) -> numpy.ndarray:
        """Choices each expert takes (kept), (E,); at most ``capacity``."""
        return numpy.bincount(self.choices[self.kept], minlength=self.n_expert)

    @property
    def dropped(self) -> int:
        """Choices dropped because their expert was full."""
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens with every choice dropped: their layer output is zero."""
        return int((~self.kept.any(axis=1)).sum())

    def order(self) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The kept choices as (token, choice index) arrays, expert by expert
        (each expert's in slot order): the rows the experts take, in the order
        the dispatch sends them (experts of one rank side by side)."""
        token, which = numpy.nonzero(self.kept)
        expert = self.choices[token, which]
        order = numpy.lexsort((self.slot[token, which], expert))
        return token[order], which[order]


def route(probs: numpy.ndarray, top_k: int, capacity_factor) -> Routing:
    """The routing of N tokens whose router probabilities are ``probs`` (N, E):
    each token's ``top_k`` most probable experts, and which of those choices
    fit the capacity (first choices first, in token order). Cost: O(N E log E)."""
    probs = numpy.asarray(backend.to_numpy(probs))
    tokens, n_expert = probs.shape
    # A stable sort of -p: equal probabilities go to the lower expert index.
    choices = numpy.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    capacity = expert_capacity(tokens, n_expert, top_k, capacity_factor)
    slot = numpy.empty_like(choices)
    taken = numpy.zeros(n_expert, dtype=numpy.int64)
    for which in range(top_k):   # first choices take their places before any second choice
        one_hot = numpy.zeros((tokens, n_expert), dtype=numpy.int64)
        one_hot[numpy.arange(tokens), choices[:, which]] = 1
        before = numpy.cumsum(one_hot, axis=0) - one_hot   # earlier tokens of this choice
        slot[:, which] = taken[choices[:, which]] + before[numpy.arange(tokens), choices[:, which]]
        taken += one_hot.sum(axis=0)
    return Routing(choices, slot < capacity, slot, n_expert, capacity)


def index_add_rows(rows: Tensor, index: numpy.ndarray, count: int) -> Tensor:
    """``out[index[a]] += rows[a]`` into ``count`` zero rows: the combine of
    the experts' outputs into their tokens. One node; its backward gathers
    ``grad[index]``. Cost: one pass over the rows."""
    xp = backend.of(rows.data)
    out = xp.zeros((count,) + rows.shape[1:], dtype=rows.data.dtype)
    xp.add.at(out, index, rows.data)
    return Tensor._make(out, (rows,), lambda grad: (grad[index],), "index_add_rows")


def load_balancing_loss(probs: Tensor, routing: Routing) -> Tensor:
    """Switch's auxiliary loss ``E * sum_i f_i P_i`` (module docstring):
    f the fraction of choices per expert before capacity (a constant), P
    the mean router probability (the gradient's path)."""
    fraction = routing.routed / (routing.tokens * routing.top_k)
    xp = backend.of(probs.data)
    mean_probs = probs.mean(axis=0)
    return (mean_probs * xp.asarray(fraction, dtype=probs.data.dtype)).sum() * routing.n_expert


def run_experts(experts, rows: Tensor, expert_of_row: numpy.ndarray) -> Tensor:
    """Each of ``experts`` (local index i) on the rows with ``expert_of_row ==
    i``, the outputs back in the rows' order. Every expert runs, on zero rows
    if none are its, so that every parameter gets a gradient."""
    outputs, order = [], []
    for index, expert in enumerate(experts):
        mine = numpy.nonzero(expert_of_row == index)[0]
        outputs.append(expert(rows[mine]))
        order.append(mine)
    order = numpy.concatenate(order)
    inverse = numpy.empty_like(order)
    inverse[order] = numpy.arange(order.size)
    return concatenate(outputs, axis=0)[inverse]


class MoE(Module):
    """The mixture-of-experts MLP (module docstring): ``router`` (C -> E) and
    ``experts`` (a ModuleList of E :class:`~minidist.models.gpt.MLP`).
    ``forward(x)`` (..., C) -> (..., C), one capacity group; it keeps
    ``routing`` (a :class:`Routing`) and ``aux_loss`` (a scalar Tensor)."""

    def __init__(self, config: GPTConfig, n_expert: int, top_k: int = 1,
                 capacity_factor: float | None = 1.25, rng=None, dtype=numpy.float32):
        super().__init__()
        check_moe_shape(n_expert, top_k, capacity_factor)
        self.n_expert, self.top_k, self.capacity_factor = n_expert, top_k, capacity_factor
        self.router = Linear(config.n_embd, n_expert, bias=False, rng=rng, dtype=dtype)
        self.experts = ModuleList([MLP(config, rng=rng, dtype=dtype) for _ in range(n_expert)])
        self.routing: Routing | None = None
        self.aux_loss: Tensor | None = None

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        width = x.shape[-1]
        flat = x.reshape(-1, width)
        tokens = flat.shape[0]
        probs = self.router(flat).softmax(axis=-1)
        routing = route(probs.data, self.top_k, self.capacity_factor)
        token, which = routing.order()
        expert = routing.choices[token, which]
        gates = probs[token, expert]
        if self.top_k > 1:   # GShard: the k probabilities of a token divided by their sum
            chosen = probs[numpy.arange(tokens)[:, None], routing.choices].sum(axis=1)
            gates = gates / chosen[token]
        out = self.experts_on(flat[token], expert)
        combined = index_add_rows(out * gates.reshape(-1, 1), token, tokens)
        self.routing = routing
        self.aux_loss = load_balancing_loss(probs, routing)
        return combined.reshape(*x.shape)

    def experts_on(self, rows: Tensor, expert: numpy.ndarray) -> Tensor:
        """The experts' outputs for ``rows``, row a by expert ``expert[a]``
        (rows grouped expert by expert). Here all experts are in this
        process; expert parallelism overrides this to send the rows to the
        rank of their expert and back."""
        return run_experts(self.experts, rows, expert)

    def extra_repr(self) -> str:
        return f"n_expert={self.n_expert}, top_k={self.top_k}, capacity_factor={self.capacity_factor}"


def moe_layers(model: Module) -> list[MoE]:
    """The model's MoE layers (expert-parallel ones included), in forward order."""
    return [module for module in model.modules() if isinstance(module, MoE)]


class MoEGPT(GPT):
    """The GPT with a :class:`MoE` in place of every block's MLP, for a
    :class:`MoEGPTConfig`. Weights are drawn as the GPT's (the experts'
    ``c_proj`` with the residual std, the router from N(0, 0.02)), so a seed
    gives the same model. :meth:`loss` is the mean next-token cross-entropy
    plus ``aux_loss_coef`` times the sum of the layers' load-balancing losses."""

    def __init__(self, config: MoEGPTConfig, rng=None, dtype=numpy.float32):
        if not isinstance(config, MoEGPTConfig):
            raise TypeError(f"MoEGPT needs a MoEGPTConfig (n_expert, top_k, ...), got "
                            f"{type(config).__name__}; use GPT for a dense model")
        rng = init.as_generator(rng)
        super().__init__(config, rng=rng, dtype=dtype)
        for block in self.transformer.h:
            block.mlp = MoE(config, config.n_expert, config.top_k, config.capacity_factor,
                            rng=rng, dtype=dtype)
        self._init_weights(rng)   # again, now over the experts' and routers' names

    def aux_loss(self) -> Tensor:
        """The sum of the blocks' load-balancing losses of the last forward."""
        losses = [layer.aux_loss for layer in moe_layers(self)]
        if any(loss is None for loss in losses):
            raise RuntimeError("MoEGPT.aux_loss: run forward first (each layer keeps the loss "
                               "of its last call)")
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return total

    def loss(self, logits, targets) -> Tensor:
        """Cross-entropy of ``targets`` (B, T) under ``logits`` plus
        ``aux_loss_coef`` times :meth:`aux_loss`."""
        vocab = logits.shape[-1]
        targets = numpy.asarray(backend.to_numpy(targets.data if isinstance(targets, Tensor)
                                                 else targets))
        lm = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        return lm + self.aux_loss() * self.config.aux_loss_coef


__all__ = ["MoE", "MoEGPT", "MoEGPTConfig", "Routing", "route", "expert_capacity",
           "index_add_rows", "load_balancing_loss", "run_experts", "moe_layers",
           "check_moe_shape"]
