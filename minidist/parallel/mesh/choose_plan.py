"""Choosing a 3D plan: every dp x tp x pp of a budget of ranks, or the Playbook's order.

Two ways to pick the mesh for ``ranks`` ranks, both on :func:`~.plan_3d.predict_step`:

* :func:`compare_plans` tries them all: every factorisation
  dp tp pp = ranks with tp within a node (:func:`factorisations`), each
  predicted, those whose fullest rank fits in the memory limit ranked by
  step time (:class:`PlanComparison`, printed with :func:`format_table`);
* :func:`playbook_plan` follows the Ultra-Scale Playbook's decision tree
  instead: start from tp1 pp1 and, while a step does not fit, double tp
  within the node, then pp across nodes; the ranks left over are data
  parallelism (:class:`PlaybookChoice`, with every decision on the way).

The two need not agree: the Playbook stops at the first plan that fits, the
comparison finds the fastest of all that fit. ::

    from minidist.parallel.mesh import GPTShape, compare_plans, playbook_plan
    gpt = GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304,
                   seq_len=4096, global_batch=1024, micro_batch=1)
    print(compare_plans(gpt, 1024, memory_limit=80e9))  # every plan that fits, fastest first
    print(playbook_plan(gpt, 1024, memory_limit=80e9))  # the Playbook's order

Costs: :func:`compare_plans` one prediction per factorisation of the ranks
(38 for 1,024 ranks on nodes of 8); :func:`playbook_plan` one per
doubling it tries, at most 1 + log2(ranks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minidist.parallel.mesh.plan_3d import StepPrediction, _gb, predict_step
from minidist.parallel.mesh.plan_inputs import CLUSTER, GPTShape, Machine, Plan, why_not


def factorisations(ranks: int, node_size: int = 8) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp tp pp = ``ranks`` and tp within a node
    (tp divides ``node_size``), tp then pp ascending."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"factorisations: ranks must be a positive int, got {ranks!r}")
    found = []
    for tp in range(1, node_size + 1):
        if node_size % tp or ranks % tp:
            continue
        for pp in range(1, ranks // tp + 1):
            if (ranks // tp) % pp == 0:
                found.append((ranks // (tp * pp), tp, pp))
    return found


@dataclass(frozen=True)
class PlanComparison:
    """What :func:`compare_plans` found: ``ranked`` (the plans that fit, fastest
    first), ``too_big`` (those over the memory limit, smallest first),
    ``impossible`` ((plan, why) for factorisations the model cannot take);
    ``node_size``: the ranks of a node, which tp stays within."""

    ranks: int
    memory_limit: float | None
    ranked: list
    too_big: list
    impossible: list
    node_size: int | None = None

    @property
    def best(self) -> StepPrediction | None:
        return self.ranked[0] if self.ranked else None

    def __str__(self) -> str:
        tried = len(self.ranked) + len(self.too_big) + len(self.impossible)
        within = "" if self.node_size is None else f" (tp within a node of {self.node_size})"
        fit = (f"{len(self.ranked)} fit (no memory limit)" if self.memory_limit is None
               else f"{len(self.ranked)} fit in {_gb(self.memory_limit)} a rank, "
                    f"{len(self.too_big)} do not")
        lines = [f"{self.ranks} ranks: {tried} plans dp x tp x pp{within}; {fit}, "
                 f"{len(self.impossible)} cannot split this model"
                 + (" (why: below)" if self.impossible else "")]
        if self.ranked:
            lines.append(format_table(self.ranked))
        if self.too_big:
            lines.append("over the memory limit: " + ", ".join(
                f"{p.plan} ({_gb(p.memory_total)})" for p in self.too_big))
        lines += [f"cannot split this model, {why}: {', '.join(plans)}"
                  for why, plans in why_impossible(self.impossible).items()]
        return "\n".join(lines)


#: The plan's own number in a reason ("tp=3", "pp x virtual_stages = 64"),
#: dropped so that the plans refused for the same reason are listed together.
_PLANS_NUMBER = re.compile(r"\b(tp|pp x virtual_stages|dp x micro_batch)\s*=\s*\d+(?: x \d+)?")


def why_impossible(impossible) -> dict[str, list[str]]:
    """The plans the model cannot take, grouped by the reason: reason ->
    the plans' names (``impossible`` as :class:`PlanComparison`'s), e.g.
    ``{"pp x virtual_stages does not divide the 32 layers": ["dp16 tp1 pp64", ...]}``."""
    grouped: dict[str, list[str]] = {}
    for plan, why in impossible:
        grouped.setdefault(_PLANS_NUMBER.sub(r"\1", why), []).append(str(plan))
    return grouped


def format_table(predictions) -> str:
    """A table of predictions: the plan, the step and its parts (ms), the memory."""
    columns = ("plan", "step ms", "compute", "tp comm", "pp bubble", "dp comm", "GB a rank")
    rows = [(str(p.plan), *(f"{getattr(p, name) * 1e3:,.1f}"
                            for name in ("total", "compute", "tp_comm", "pp_bubble", "dp_comm")),
             f"{p.memory_total / 1e9:,.1f}") for p in predictions]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def render(cells):
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths)))

    return "\n".join([render(columns), render(["-" * w for w in widths])]
                     + [render(r) for r in rows])


def compare_plans(model: GPTShape, ranks: int, machine: Machine = CLUSTER,
                  memory_limit: float | None = None, **options) -> PlanComparison:
    """Predict every (dp, tp, pp) of :func:`factorisations` on ``machine``,
    keep those whose fullest rank fits in ``memory_limit`` bytes, and rank
    them by step time. ``options``: the rest of :class:`Plan`
    (``schedule``, ``sequence_parallel``, ``zero_stage``, ...) for every plan,
    and ``algorithm``, ``itemsize`` of :func:`predict_step`."""
    predict_options = {key: options.pop(key) for key in ("algorithm", "itemsize")
                       if key in options}
    fitting, too_big, impossible = [], [], []
    for dp, tp, pp in factorisations(ranks, machine.node_size):
        plan = Plan(dp, tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            impossible.append((plan, why))
            continue
        step = predict_step(model, plan, machine, **predict_options)
        (fitting if step.fits(memory_limit) else too_big).append(step)
    fitting.sort(key=lambda p: p.total)
    too_big.sort(key=lambda p: p.memory_total)
    return PlanComparison(ranks, memory_limit, fitting, too_big, impossible,
                          machine.node_size)


@dataclass(frozen=True)
class PlaybookChoice:
    """The plan :func:`playbook_plan` reached, and the decisions on the way."""

    step: StepPrediction | None
    decisions: list

    def __str__(self) -> str:
        return "\n".join(["the Playbook's order:"] + [f"  {d}" for d in self.decisions]
                         + ([str(self.step)] if self.step else []))


def playbook_plan(model: GPTShape, ranks: int, machine: Machine = CLUSTER,
                  memory_limit: float | None = None, **options) -> PlaybookChoice:
    """The Ultra-Scale Playbook's decision tree, in its order: first make a
    step fit, with tensor parallelism within a node (tp doubled up to
    ``node_size``), then with pipeline stages across nodes (pp doubled);
    every rank left over goes to data parallelism, which grows the batch a
    step processes at once. ``options`` as :func:`compare_plans`'s."""
    predict_options = {key: options.pop(key) for key in ("algorithm", "itemsize")
                       if key in options}
    decisions = []

    def attempt(tp, pp):
        if ranks % (tp * pp):
            return None, f"tp{tp} pp{pp} does not divide {ranks} ranks"
        plan = Plan(ranks // (tp * pp), tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            return None, f"{plan}: {why}"
        step = predict_step(model, plan, machine, **predict_options)
        if not step.fits(memory_limit):
            return None, f"{plan}: {_gb(step.memory_total)} a rank, over the limit"
        return step, f"{plan}: fits in {_gb(step.memory_total)} a rank"

    tp, pp = 1, 1
    while True:
        step, said = attempt(tp, pp)
        decisions.append(said)
        if step is not None:
            decisions.append(f"the remaining factor goes to data parallelism: dp{step.plan.dp}")
            return PlaybookChoice(step, decisions)
        if tp * 2 <= machine.node_size and ranks % (tp * 2 * pp) == 0 \
                and model.n_head % (tp * 2) == 0:
            tp *= 2
            decisions.append(f"grow tensor parallelism within the node: tp{tp}")
        elif ranks % (tp * pp * 2) == 0 and model.n_layer % (pp * 2) == 0:
            pp *= 2
            decisions.append(f"grow pipeline stages across nodes (tp is at the node's "
                             f"size): pp{pp}")
        else:
            decisions.append("no more tp or pp to add: nothing fits")
            return PlaybookChoice(None, decisions)

