"""``minidist plan``: a GPT's step predicted on a mesh, or every mesh compared.

What the command does once :mod:`minidist.cli` has parsed its arguments:
build the :class:`~.plan_inputs.GPTShape` and the
:class:`~.plan_inputs.Machine` they describe (the links' alphas those of
:data:`~.plan_inputs.CLUSTER`, their bandwidths given), then print either
one plan's breakdown (``--mesh DPxTPxPP``: :func:`~.plan_3d.predict_step`)
and whether it fits in ``--memory``, or every plan of ``--ranks`` compared
and the Playbook's choice (:mod:`.choose_plan`); with ``--html PATH``, the
same arguments as the start of the planner page (:func:`page_settings`;
``viz/planner_page.py`` writes it, as :mod:`minidist.cli` asks). With ``--topology`` (a
:class:`~minidist.topology.Topology`: ``dgx``, ``commodity:16``, or
``key=value`` pairs) the machine's node size and links are the topology's:
``intra`` its intra link, ``inter`` a rank's share of its node's NICs when
every rank sends off the node at once (the NIC's bandwidth times
nics_per_node / ranks_per_node, over the spine's oversubscription: the
planner's data-parallel and pipeline traffic runs on every rank at once),
and the mesh must fit the cluster. A mistake in the
arguments (a size or bandwidth it cannot read, heads that do not divide the
width, a mesh of other than ``--ranks`` ranks) is one line and exit status
2, before anything is printed. Costs: those of the predictions it prints.
"""

from __future__ import annotations

import math

from minidist.alpha_beta import Params, parse_bandwidth, parse_size
from minidist.parallel.mesh.choose_plan import compare_plans, playbook_plan
from minidist.parallel.mesh.plan_3d import predict_step
from minidist.parallel.mesh.plan_inputs import CLUSTER, GPTShape, Machine, Plan, why_not
from minidist.topology import Topology, TopologyError, parse_topology

#: The ranks compared when ``--ranks`` is not given (with ``--mesh``, the mesh's own).
DEFAULT_RANKS = 1024


def _refuse(what: str) -> SystemExit:
    """One line and exit status 2, as argparse says a mistake (see :mod:`minidist.cli`)."""
    return SystemExit(f"minidist plan: error: {what} (see `minidist plan --help`)")


def _amount(flag: str, text: str, parse, unit: str) -> float:
    """``text`` read by ``parse`` (a size, a bandwidth): a positive, finite number,
    or a one-line refusal naming the flag."""
    try:
        value = parse(text)
    except ValueError as error:
        raise _refuse(f"{flag} {text!r}: {error}; give a number with a unit, such as "
                      f"{unit}") from None
    except OverflowError:  # int() of an infinite float: "1e400GB"
        value = float("inf")
    if not 0 < value < float("inf"):
        raise _refuse(f"{flag} {text!r} must be above 0, such as {unit}")
    return value


def _mesh(text: str) -> tuple[int, int, int]:
    try:
        dp, tp, pp = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise _refuse(f"--mesh {text!r} is not DPxTPxPP, e.g. 8x8x16") from None
    return dp, tp, pp


def plan_command(args) -> int:
    """``minidist plan``: with ``--mesh DPxTPxPP`` the breakdown of that plan;
    otherwise every plan of ``--ranks`` compared, and the Playbook's choice
    beside the best (the arguments: :mod:`minidist.cli`). Every argument is
    checked before anything is printed."""
    model, machine, limit, options, mesh, ranks, links = _inputs(args)
    plan = None if mesh is None else _checked_plan(model, mesh, options)
    _say(f"GPT of {model.parameters() / 1e9:.2f} B parameters: {model.n_layer} layers, "
          f"h {model.n_embd}, {model.n_head} heads, vocabulary {model.vocab_size}, "
          f"{model.global_batch} sequences of {model.seq_len} tokens a step, "
          f"{model.micro_batch} a micro-batch")
    _say(f"machine: {args.tflops:g} TFLOP/s a rank, {links}")
    if plan is not None:
        step = predict_step(model, plan, machine)
        _say(step)
        # --memory is the budget of the comparison; one plan is told against it too.
        _say(f"  {'fits' if step.fits(limit) else 'does NOT fit'} in --memory {args.memory} "
              "a rank")
        return 0
    _say(compare_plans(model, ranks, machine, memory_limit=limit, **options))
    _say(playbook_plan(model, ranks, machine, memory_limit=limit, **options))
    return 0


def _inputs(args):
    """The arguments checked and read: (model, machine, memory limit, the plan's
    options, the mesh or None, the ranks, the machine's links in words); a
    mistake is one line and status 2."""
    limit = _amount("--memory", args.memory, parse_size, "80GB")
    topology_text = getattr(args, "topology", None)
    if topology_text is not None:
        given = [flag for flag, value in (("--node-size", args.node_size),
                                          ("--intra", args.intra), ("--inter", args.inter))
                 if value is not None]
        if given:
            raise _refuse(f"--topology {topology_text} sets the node size and the links, so "
                          f"{', '.join(given)} would contradict it: give them in the topology "
                          "(such as nodes=128,ranks_per_node=8,intra=200GB/s,inter=25GB/s) or "
                          "drop --topology")
    else:
        intra = _amount("--intra", args.intra or "200GB/s", parse_bandwidth, "200GB/s")
        inter = _amount("--inter", args.inter or "25GB/s", parse_bandwidth, "25GB/s")
    if args.n_embd % args.n_head:
        raise _refuse(f"--n-head {args.n_head} does not divide --n-embd {args.n_embd}: each "
                      "head takes an equal share of the width; choose heads that divide it "
                      f"(such as {_divisor_near(args.n_embd, args.n_head)})")
    mesh = _mesh(args.mesh) if args.mesh else None
    if mesh is not None and args.ranks is not None and args.ranks != _product(mesh):
        raise _refuse(f"--mesh {args.mesh} is {_product(mesh):,} ranks, but --ranks is "
                      f"{args.ranks:,}: a mesh fixes the ranks, so give --mesh alone (one "
                      "plan) or --ranks alone (every plan of that many ranks)")
    ranks = DEFAULT_RANKS if args.ranks is None else args.ranks
    if mesh is not None:
        ranks = _product(mesh)
    model = GPTShape(args.n_layer, args.n_embd, args.n_head, args.vocab, args.seq_len,
                     args.global_batch, args.micro_batch)
    if topology_text is not None:
        try:
            topology = parse_topology(topology_text, ranks,
                                      what="the mesh" if mesh is not None else "--ranks")
        except TopologyError as error:
            raise _refuse(str(error)) from None
        if topology is None:
            raise _refuse("--topology flat has no nodes for the planner; give --node-size, "
                          "--intra and --inter instead, or a topology such as dgx")
        machine = machine_of(topology, args.tflops * 1e12)
        links = (f"{topology.describe()}; inter {1 / machine.inter.beta / 1e9:g}GB/s a rank "
                 "when all send")
    else:
        machine = Machine(flops=args.tflops * 1e12,
                          intra=Params(CLUSTER.intra.alpha, 1 / intra),
                          inter=Params(CLUSTER.inter.alpha, 1 / inter),
                          node_size=args.node_size or CLUSTER.node_size)
        links = (f"{machine.node_size} ranks a node, {args.intra or '200GB/s'} within a node, "
                 f"{args.inter or '25GB/s'} between nodes")
    options = {"schedule": args.schedule, "virtual_stages": args.virtual_stages,
               "sequence_parallel": args.sequence_parallel, "recompute": args.recompute,
               "zero_stage": args.zero_stage}
    return model, machine, limit, options, mesh, ranks, links


def machine_of(topology: Topology, flops: float) -> Machine:
    """The planner's :class:`~.plan_inputs.Machine` of a topology: its node
    size, its intra link, and as the inter link a rank's share of its node's
    NICs with every rank sending off the node (see the module's docstring)."""
    share = topology.nics_per_node / topology.ranks_per_node
    return Machine(flops=flops, intra=topology.intra,
                   inter=Params(topology.inter.alpha, topology.inter_beta / share),
                   node_size=topology.ranks_per_node)


def _checked_plan(model: GPTShape, mesh, options: dict) -> Plan:
    """The plan of ``--mesh``, or a one-line refusal saying why it cannot split the model."""
    plan = Plan(*mesh, **options)
    why = why_not(model, plan)
    if why is not None:
        raise SystemExit(f"minidist plan: {plan} cannot split this model: {why}")
    return plan


def page_settings(args) -> dict:
    """``minidist plan --html``: the arguments, checked as for the printed
    plan, as the planner page's settings (:mod:`viz.planner_page` writes the
    page; this layer does not draw). The page starts on ``--mesh``, or else
    on the fastest plan of ``--ranks`` that fits (all of them on dp when none
    does: the page then shows by how much)."""
    model, machine, limit, options, mesh, ranks, _ = _inputs(args)
    if mesh is not None:
        _checked_plan(model, mesh, options)
    else:
        best = compare_plans(model, ranks, machine, memory_limit=limit, **options).best
        mesh = (best.plan.dp, best.plan.tp, best.plan.pp) if best else (ranks, 1, 1)
    dp, tp, pp = mesh
    schedule = "interleaved_1f1b" if args.schedule == "interleaved" else args.schedule
    return {"n_layer": model.n_layer, "n_embd": model.n_embd, "n_head": model.n_head,
            "vocab_size": model.vocab_size, "seq_len": model.seq_len,
            "global_batch": model.global_batch, "micro_batch": model.micro_batch,
            "dp": dp, "tp": tp, "pp": pp, "schedule": schedule,
            "virtual_stages": args.virtual_stages, "sequence_parallel": args.sequence_parallel,
            "zero_stage": args.zero_stage, "recompute": "full" if args.recompute else "none",
            "memory_gb": limit / 1e9, "tflops": args.tflops,
            "intra_gbs": 1 / machine.intra.beta / 1e9, "inter_gbs": 1 / machine.inter.beta / 1e9,
            "node_size": machine.node_size}


def _say(text="") -> None:
    """``print``, each line wrapped at the terminal's width (80 when it is not
    a terminal), its indent kept and two more on the lines it continues
    onto; a word (a plan's name, a size) is never broken. The tables' lines
    are narrower than 80 and come out as they are."""
    import shutil
    import textwrap

    width = max(shutil.get_terminal_size().columns, 40)
    for line in str(text).split("\n"):
        indent = " " * (len(line) - len(line.lstrip(" ")))
        print(textwrap.fill(line, width, subsequent_indent=indent + "  ",
                            break_long_words=False, break_on_hyphens=False)
              if len(line) > width else line)


def _product(mesh) -> int:
    dp, tp, pp = mesh
    return dp * tp * pp


def _divisor_near(width: int, heads: int) -> int:
    """The divisor of ``width`` nearest ``heads`` (the smaller on a tie)."""
    small = [d for d in range(1, math.isqrt(width) + 1) if width % d == 0]
    return min(small + [width // d for d in small], key=lambda d: (abs(d - heads), d))
