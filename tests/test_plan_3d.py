"""The 3D plan's prediction, part by part: against the real GPT's parameters,
hand counts on small numbers, the collective simulator, the pipeline's clock
and ZeRO's formulas."""

from __future__ import annotations

import math
import time

import pytest

from minidist import cli, costmodel, memory
from minidist.alpha_beta import Params
from minidist.distributed.simulator import simulate
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.data.costs import zero_bytes_per_step, zero_model_state_bytes
from minidist.parallel.mesh import choose_plan, plan_3d
from minidist.parallel.mesh.plan_3d import predict_step
from minidist.parallel.mesh.plan_inputs import CLUSTER, GPTShape, Machine, Plan
from minidist.parallel.pipeline.schedules import UNIT_NS, make_schedule
from minidist.parallel.pipeline.simulate import (
    bubble_fraction,
    peak_live_microbatches,
    simulate_schedule,
)

# Small enough to count by hand, divisible enough for every mesh below.
SMALL = GPTShape(n_layer=8, n_embd=64, n_head=8, vocab_size=256, seq_len=32,
                 global_batch=64, micro_batch=2)
# Links without the exchange's own beta: what the simulator's network models.
# Slow, so that a stage's time is milliseconds, which the pipeline clock's
# whole nanoseconds round by less than 1e-7.
MACHINE = Machine(flops=1e9, intra=Params(alpha=2e-6, beta=1e-9),
                  inter=Params(alpha=1e-5, beta=1e-7), node_size=4)
FREE_LINKS = Machine(flops=1e9, intra=Params(0.0, 0.0), inter=Params(0.0, 0.0), node_size=4)


@pytest.mark.parametrize("bias", [True, False])
def test_parameters_are_the_gpts(bias):
    config = GPTConfig(vocab_size=40, block_size=12, n_layer=3, n_head=2, n_embd=16, bias=bias)
    shape = GPTShape.from_config(config, global_batch=4)
    assert shape.parameters() == GPT(config).num_parameters()
    # Trained on shorter windows, the model is the same.
    assert GPTShape.from_config(config, 4, seq_len=5).parameters() == shape.parameters()
    assert plan_3d.parameters_per_rank(shape, tp=1, pp=1) == [shape.parameters()]


def _split_block_parameters(block, tp: int) -> int:
    """One rank's share of a real Block: Megatron's column splits (c_attn,
    c_fc: weights and biases by output) and row splits (the c_projs: weights
    by input, biases whole); LayerNorms whole."""
    total = 0
    for name, param in block.named_parameters():
        column = name.startswith(("attn.c_attn", "mlp.c_fc"))
        row_weight = name.endswith("c_proj.weight")
        total += param.data.size // tp if column or row_weight else param.data.size
    return total


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_blocks_share_under_tp_is_the_split_blocks(bias, tp):
    config = GPTConfig(vocab_size=40, block_size=12, n_layer=1, n_head=4, n_embd=16, bias=bias)
    block = GPT(config).transformer.h[0]
    shape = GPTShape.from_config(config, global_batch=4)
    assert shape.block_parameters(tp) == _split_block_parameters(block, tp)


def test_pipeline_ranks_hold_the_blocks_the_embedding_and_its_tied_copy():
    per_rank = plan_3d.parameters_per_rank(SMALL, tp=2, pp=4)
    h, V, s = SMALL.n_embd, SMALL.vocab_size, SMALL.positions
    blocks = 2 * SMALL.block_parameters(2)
    assert per_rank == [blocks + V * h // 2 + s * h, blocks, blocks, blocks + 2 * h + V * h // 2]


def test_flops_by_hand():
    shape = GPTShape(n_layer=2, n_embd=8, n_head=2, vocab_size=16, seq_len=4, global_batch=3)
    # N_mm = 12 * 2 * 64 + 16 * 8 = 1664; forward per token 2 * 1664 + 4 * 2 * 4 * 8 = 3584.
    assert shape.matmul_parameters() == 1664
    assert shape.forward_flops_per_token() == 3584
    assert shape.step_flops() == 3 * 3584 * 3 * 4
    assert shape.step_flops(recompute=True) == 4 * 3584 * 3 * 4


def test_activations_are_the_courses_one_count():
    """A layer's activations are memory.transformer_block_activation_bytes
    (what minidist's ops keep, the ledger's count): e (25 sbh + 2 sb + a s^2 b)
    unsplit, e (sbh (12 + 17/t) + 2 sb + a s^2 b / t) with TP, e (sbh (4 +
    27/t) + 2 sb / t + a s^2 b / t) with sequence parallelism, e sbh with
    full recomputation (/ t with sequence parallelism)."""
    s, b, h, a = SMALL.seq_len, SMALL.micro_batch, SMALL.n_embd, SMALL.n_head
    sbh, sb, scores = s * b * h, s * b, a * s * s * b
    act = SMALL.layer_activation_bytes
    assert a // 4 > 1     # more than one head a rank at t = 4: 17/t, 27/t
    assert act(itemsize=2) == 2 * (25 * sbh + 2 * sb + scores)
    assert act(tp=4, itemsize=2) == 2 * (sbh * 12 + sbh * 17 // 4 + 2 * sb + scores // 4)
    assert act(tp=4, sequence_parallel=True, itemsize=2) == \
        2 * (sbh * 4 + sbh * 27 // 4 + 2 * sb // 4 + scores // 4)
    assert act(recompute=True, itemsize=2) == 2 * sbh
    assert act(tp=4, sequence_parallel=True, recompute=True, itemsize=2) == 2 * sbh // 4
    assert act(tp=2, itemsize=4) == memory.transformer_block_activation_bytes(
        b, s, h, a, 4, tp=2)


def _costs(step, dimension):
    return {cost.collective: cost for cost in step.collectives if cost.dimension == dimension}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp_collectives_are_the_simulators(sequence_parallel):
    plan = Plan(dp=2, tp=4, pp=2, sequence_parallel=sequence_parallel)
    step = predict_step(SMALL, plan, MACHINE, itemsize=4)
    costs = _costs(step, "tp")
    kinds = ("all_gather", "reduce_scatter") if sequence_parallel else ("all_reduce",)
    assert sorted(costs) == sorted(kinds)
    link = MACHINE.intra
    for kind in kinds:
        cost = costs[kind]
        assert cost.nbytes == SMALL.seq_len * SMALL.micro_batch * SMALL.n_embd * 4
        simulated = simulate(kind, "ring", world_size=4, nbytes=int(cost.nbytes),
                             alpha=link.alpha, beta=link.beta, gamma=link.gamma)
        assert cost.seconds == pytest.approx(simulated.time, rel=1e-9)
        # Two per block, forward and backward, on every micro-batch.
        assert cost.calls == 2 * (SMALL.n_layer // 2) * 2 * step.microbatches
    assert step.tp_comm == pytest.approx(sum(c.total for c in costs.values()))


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_dp_collectives_are_the_simulators_and_zeros(zero_stage):
    plan = Plan(dp=8, tp=1, pp=2, zero_stage=zero_stage)
    step = predict_step(SMALL, plan, MACHINE, itemsize=4)
    per_rank = max(plan_3d.parameters_per_rank(SMALL, 1, 2))
    link = MACHINE.inter   # dp 8 spans 8 ranks: past the node of 4
    sent = 0.0
    for kind, cost in _costs(step, "dp").items():
        assert cost.link == "inter-node" and cost.nbytes == per_rank * 4
        simulated = simulate(kind, "ring", world_size=8, nbytes=int(cost.nbytes),
                             alpha=link.alpha, beta=link.beta, gamma=link.gamma)
        assert cost.seconds == pytest.approx(simulated.time, rel=1e-9)
        share = 2 if kind == "all_reduce" else 1
        sent += cost.calls * share * 7 / 8 * cost.nbytes
    assert step.dp_comm == pytest.approx(sum(c.total for c in _costs(step, "dp").values()))
    assert sent == pytest.approx(sum(zero_bytes_per_step(per_rank, 8, zero_stage, 4).values()))
    states = sum(v for k, v in step.memory.items() if k != "activations")
    assert states == pytest.approx(zero_model_state_bytes(per_rank, 8, zero_stage))


def test_compute_by_hand():
    plan = Plan(dp=2, tp=2, pp=2)
    step = predict_step(SMALL, plan, FREE_LINKS)
    forward = 2 * SMALL.micro_batch * SMALL.seq_len * (
        SMALL.matmul_parameters() + 2 * SMALL.n_layer * SMALL.seq_len * SMALL.n_embd) / 4 / 1e9
    assert step.microbatches == 64 // (2 * 2)
    assert step.compute == pytest.approx(step.microbatches * 3 * forward)
    # Summed over all ranks, the compute is the step's FLOPs at the machine's speed.
    assert step.compute * plan.ranks == pytest.approx(SMALL.step_flops() / 1e9)
    assert step.tp_comm == 0.0 and step.dp_comm == 0.0


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_pipeline_without_transfer_time_has_the_textbook_bubble(schedule, v):
    plan = Plan(dp=1, tp=1, pp=4, schedule=schedule, virtual_stages=v)
    step = predict_step(SMALL, plan, FREE_LINKS)
    f, b = step.forward_time, step.backward_time
    m, p = step.microbatches, 4
    assert m % p == 0
    assert step.pp_bubble == pytest.approx((p - 1) * (f + b) / v, rel=1e-6)
    assert step.total == pytest.approx((m + (p - 1) / v) * (f + b), rel=1e-6)


@pytest.mark.parametrize("plan", [Plan(2, 2, 4), Plan(1, 2, 4, schedule="interleaved",
                                                       virtual_stages=2, recompute=True)])
def test_pipeline_is_the_schedules_clock(plan):
    """The step's pipeline part is simulate_schedule's makespan, its bubble that
    clock's bubble fraction, its peak activations the clock's memory events."""
    step = predict_step(SMALL, plan, MACHINE)
    assert step.transfer_time > 0
    unit = 1e9 / UNIT_NS
    schedule = make_schedule(plan.schedule, plan.pp, step.microbatches, plan.virtual_stages)
    v = plan.virtual_stages
    events = simulate_schedule(schedule, step.forward_time / v * unit,
                               step.backward_time / v * unit, step.transfer_time * unit,
                               recompute=plan.recompute)
    makespan = max(e["end"] for e in events if e["kind"] == "compute") * 1e-9
    assert step.total - step.dp_comm == pytest.approx(makespan, rel=1e-9)
    assert step.pp_bubble / makespan == pytest.approx(bubble_fraction(events), rel=1e-6)
    assert plan_3d.peak_live(schedule) == peak_live_microbatches(events)


@pytest.mark.parametrize("schedule, live", [("1f1b", 4), ("gpipe", 32)])  # p; m
def test_activation_memory_counts_the_microbatches_in_flight(schedule, live):
    plan = Plan(dp=1, tp=2, pp=4, schedule=schedule)
    step = predict_step(SMALL, plan, FREE_LINKS)
    assert step.microbatches == 32 and step.live_microbatches == live
    layer = SMALL.layer_activation_bytes(tp=2)
    assert step.memory["activations"] == live * SMALL.n_layer // 4 * layer


def test_sequence_parallelism_and_recomputation_save_activation_memory():
    steps = {(sp, rc): predict_step(SMALL, Plan(2, 4, 2, sequence_parallel=sp, recompute=rc),
                                    MACHINE)
             for sp in (False, True) for rc in (False, True)}
    activations = {key: step.memory["activations"] for key, step in steps.items()}
    assert activations[(True, False)] < activations[(False, False)]
    assert activations[(False, True)] < activations[(False, False)]
    assert activations[(True, True)] < activations[(False, True)]
    # Recomputation pays a forward more of compute.
    assert steps[(False, True)].compute == pytest.approx(steps[(False, False)].compute * 4 / 3)


def test_tp_past_a_node_is_slower_on_a_slower_link():
    model = GPTShape(n_layer=8, n_embd=256, n_head=16, vocab_size=512, seq_len=128,
                     global_batch=64, micro_batch=1)
    inside, across = Plan(dp=4, tp=4, pp=1), Plan(dp=2, tp=8, pp=1)
    fast_node = predict_step(model, across, replace_node(MACHINE, 8))
    slow = predict_step(model, across, MACHINE)                # tp 8 on nodes of 4
    assert slow.links["tp"] == "inter-node" and fast_node.links["tp"] == "intra-node"
    assert slow.tp_comm > fast_node.tp_comm
    assert slow.total > predict_step(model, inside, MACHINE).total


def replace_node(machine: Machine, node_size: int) -> Machine:
    return Machine(machine.flops, machine.intra, machine.inter, node_size)


def test_factorisations():
    found = choose_plan.factorisations(16, node_size=4)
    assert all(dp * tp * pp == 16 and 4 % tp == 0 for dp, tp, pp in found)
    # tp 1: pp in 1, 2, 4, 8, 16; tp 2: 1, 2, 4, 8; tp 4: 1, 2, 4.
    assert len(found) == len(set(found)) == 12


def test_compare_plans_filters_by_memory_and_ranks_by_time():
    everything = choose_plan.compare_plans(SMALL, 16, MACHINE)
    assert not everything.too_big
    memories = sorted(step.memory_total for step in everything.ranked)
    limit = memories[len(memories) // 2]
    compared = choose_plan.compare_plans(SMALL, 16, MACHINE, memory_limit=limit)
    assert compared.ranked and compared.too_big
    assert all(step.memory_total <= limit for step in compared.ranked)
    assert all(step.memory_total > limit for step in compared.too_big)
    totals = [step.total for step in compared.ranked]
    assert totals == sorted(totals)
    assert len(compared.ranked) + len(compared.too_big) == len(everything.ranked)
    # pp 16 cannot cut 8 layers: named, not predicted.
    assert any("does not divide the 8 layers" in why for _, why in compared.impossible)
    assert "dp" in str(compared)


def test_the_comparison_says_what_its_counts_are_of_and_why_plans_cannot_split():
    """The first line counts plans out of the factorisations tried, and every
    plan the model cannot take is listed under its reason."""
    compared = choose_plan.compare_plans(SMALL, 16, MACHINE)
    text = str(compared)
    first = text.splitlines()[0]
    tried = len(compared.ranked) + len(compared.too_big) + len(compared.impossible)
    assert tried == len(choose_plan.factorisations(16, MACHINE.node_size))
    assert first.startswith(f"16 ranks: {tried} plans dp x tp x pp (tp within a node of "
                            f"{MACHINE.node_size}); {len(compared.ranked)} fit (no memory limit)")
    assert f"{len(compared.impossible)} cannot split this model (why: below)" in first
    grouped = choose_plan.why_impossible(compared.impossible)
    assert sum(len(plans) for plans in grouped.values()) == len(compared.impossible)
    assert "pp x virtual_stages does not divide the 8 layers" in grouped
    for why, plans in grouped.items():
        assert f"cannot split this model, {why}: {', '.join(plans)}" in text
    assert choose_plan.why_impossible([(Plan(1, 3, 1), "tp=3 does not divide the 8 heads"),
                                       (Plan(1, 6, 1), "tp=6 does not divide the 8 heads")]) == {
        "tp does not divide the 8 heads": ["dp1 tp3 pp1", "dp1 tp6 pp1"]}


def test_playbook_grows_tp_within_the_node_then_pp():
    model = GPTShape(n_layer=8, n_embd=256, n_head=16, vocab_size=512, seq_len=128,
                     global_batch=64, micro_batch=1)
    memory = {(tp, pp): predict_step(model, Plan(16 // (tp * pp), tp, pp), MACHINE).memory_total
              for tp, pp in ((1, 1), (2, 1), (4, 1), (4, 2), (4, 4))}
    # Just under what tp 4 needs: the Playbook must go on to pipeline stages.
    limit = (memory[(4, 1)] + memory[(4, 2)]) / 2
    assert memory[(4, 2)] <= limit < memory[(4, 1)]
    choice = choose_plan.playbook_plan(model, 16, MACHINE, memory_limit=limit)
    assert (choice.step.plan.dp, choice.step.plan.tp, choice.step.plan.pp) == (2, 4, 2)
    assert [d.split(":")[0] for d in choice.decisions if d.startswith("grow")] == [
        "grow tensor parallelism within the node", "grow tensor parallelism within the node",
        "grow pipeline stages across nodes (tp is at the node's size)"]
    nothing = choose_plan.playbook_plan(model, 16, MACHINE, memory_limit=1.0)
    assert nothing.step is None and "nothing fits" in nothing.decisions[-1]


def test_impossible_plans_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="tp=3 does not divide the 8 heads"):
        predict_step(SMALL, Plan(1, 3, 1))
    with pytest.raises(ValueError, match="does not divide the global batch"):
        predict_step(SMALL, Plan(3, 1, 1))


def test_a_thousand_ranks_in_well_under_a_second():
    model = GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
                     global_batch=1024, micro_batch=1)
    start = time.process_time()
    step = predict_step(model, Plan(dp=8, tp=8, pp=16), CLUSTER)
    spent = time.process_time() - start
    assert step.microbatches == 128 and step.plan.ranks == 1024
    assert math.isclose(step.compute + step.tp_comm + step.pp_bubble + step.dp_comm, step.total)
    # CPU seconds (not wall): about half a second on the shared 2-core machine.
    assert spent < 2.0


def test_minidist_plan_prints_the_comparison_and_the_playbook(capsys):
    model = ["--n-layer", "8", "--n-embd", "256", "--n-head", "16", "--vocab", "512",
             "--seq-len", "128", "--global-batch", "64"]
    assert cli.main(["plan", "--ranks", "16", "--memory", "1GB", *model]) == 0
    out = capsys.readouterr().out
    assert "plans dp x tp x pp" in out and "the Playbook's order" in out
    assert "cannot split this model" in out
    assert cli.main(["plan", "--mesh", "2x4x2", *model]) == 0
    assert "dp2 tp4 pp2" in capsys.readouterr().out
    assert cli.main(["plan", "--mesh", "2x3x2", *model]) == 2
    assert "tp=3 does not divide the 16 heads" in capsys.readouterr().err
    assert cli.main(["plan", "--mesh", "8x8", *model]) == 2
    assert "is not DPxTPxPP" in capsys.readouterr().err


PLAN_MISTAKES = [
    # (arguments, words the one line must contain)
    (["--memory", "abc"], "--memory 'abc': cannot read 'abc'"),
    (["--memory=-5GB"], "--memory '-5GB' must be above 0"),
    (["--memory", "1e400GB"], "--memory '1e400GB' must be above 0"),
    (["--inter", "abc"], "--inter 'abc': cannot read 'abc'"),
    (["--intra", "0GB/s"], "--intra '0GB/s' must be above 0"),
    (["--n-head", "7"], "--n-head 7 does not divide --n-embd 4096"),
    (["--mesh", "8x8x16", "--ranks", "3"], "--mesh 8x8x16 is 1,024 ranks, but --ranks is 3"),
    (["--mesh", "8x8"], "is not DPxTPxPP"),
]


@pytest.mark.parametrize("arguments, words", PLAN_MISTAKES,
                         ids=[" ".join(a) for a, _ in PLAN_MISTAKES])
def test_a_mistake_in_minidist_plan_is_one_line_and_status_2(arguments, words, capsys):
    assert cli.main(["plan", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before anything is printed
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], captured.err


def test_one_plan_is_told_against_memory_and_its_own_ranks(capsys):
    model = ["--n-layer", "8", "--n-embd", "256", "--n-head", "16", "--vocab", "512",
             "--seq-len", "128", "--global-batch", "64"]
    assert cli.main(["plan", "--mesh", "2x4x2", "--ranks", "16", "--memory", "1GB",
                     *model]) == 0
    assert "fits in --memory 1GB a rank" in capsys.readouterr().out
    assert cli.main(["plan", "--mesh", "2x4x2", "--memory", "1MB", *model]) == 0
    assert "does NOT fit in --memory 1MB a rank" in capsys.readouterr().out


def test_auto_takes_the_cost_models_fastest_algorithm_for_each_call():
    plan = Plan(dp=4, tp=4, pp=1)
    ring = predict_step(SMALL, plan, MACHINE)
    auto = predict_step(SMALL, plan, MACHINE, algorithm="auto")
    for cost in auto.collectives:
        link = MACHINE.intra if cost.link == "intra-node" else MACHINE.inter
        assert cost.algorithm == costmodel.best(cost.collective, cost.ranks, cost.nbytes,
                                                params=link)
    assert auto.tp_comm <= ring.tp_comm and auto.dp_comm <= ring.dp_comm
