"""``minidist plan``: a GPT's step predicted on a mesh, or every mesh compared.

What the command does once :mod:`minidist.cli` has parsed its arguments:
build the :class:`~.plan_inputs.GPTShape` and the
:class:`~.plan_inputs.Machine` they describe (the links' alphas those of
:data:`~.plan_inputs.CLUSTER`, their bandwidths given), then print either
one plan's breakdown (``--mesh DPxTPxPP``: :func:`~.plan_3d.predict_step`)
or every plan of ``--ranks`` compared and the Playbook's choice
(:mod:`.choose_plan`). Costs: those of the predictions it prints.
"""

from __future__ import annotations

from minidist.alpha_beta import Params, parse_bandwidth, parse_size
from minidist.parallel.mesh.choose_plan import compare_plans, playbook_plan
from minidist.parallel.mesh.plan_3d import predict_step
from minidist.parallel.mesh.plan_inputs import CLUSTER, GPTShape, Machine, Plan, why_not


def plan_command(args) -> int:
    """``minidist plan``: with ``--mesh DPxTPxPP`` the breakdown of that plan;
    otherwise every plan of ``--ranks`` compared, and the Playbook's choice
    beside the best (the arguments: :mod:`minidist.cli`)."""
    model = GPTShape(args.n_layer, args.n_embd, args.n_head, args.vocab, args.seq_len,
                     args.global_batch, args.micro_batch)
    machine = Machine(flops=args.tflops * 1e12,
                      intra=Params(CLUSTER.intra.alpha, 1 / parse_bandwidth(args.intra)),
                      inter=Params(CLUSTER.inter.alpha, 1 / parse_bandwidth(args.inter)),
                      node_size=args.node_size)
    options = {"schedule": args.schedule, "virtual_stages": args.virtual_stages,
               "sequence_parallel": args.sequence_parallel, "recompute": args.recompute,
               "zero_stage": args.zero_stage}
    print(f"GPT of {model.parameters() / 1e9:.2f} B parameters: {model.n_layer} layers, "
          f"h {model.n_embd}, {model.n_head} heads, vocabulary {model.vocab_size}, "
          f"{model.global_batch} sequences of {model.seq_len} tokens a step, "
          f"{model.micro_batch} a micro-batch")
    print(f"machine: {args.tflops:g} TFLOP/s a rank, {machine.node_size} ranks a node, "
          f"{args.intra} within a node, {args.inter} between nodes")
    if args.mesh:
        try:
            dp, tp, pp = (int(part) for part in args.mesh.lower().split("x"))
        except ValueError:
            raise SystemExit(f"minidist plan: --mesh {args.mesh!r} is not DPxTPxPP, "
                             "e.g. 8x8x16") from None
        plan = Plan(dp, tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            raise SystemExit(f"minidist plan: {plan} cannot split this model: {why}")
        print(predict_step(model, plan, machine))
        return 0
    limit = parse_size(args.memory)
    print(compare_plans(model, args.ranks, machine, memory_limit=limit, **options))
    print(playbook_plan(model, args.ranks, machine, memory_limit=limit, **options))
    return 0
