"""Clusters with a shape: the presets, their text, their refusals, and the
simulator on them held to the two-level formulas (minidist/topology.py,
collectives/topology_costs.py, the sim transport's NICs)."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import costmodel, topology
from minidist.alpha_beta import Params
from minidist.cli import main
from minidist.distributed.collectives import topology_costs
from minidist.distributed.simulator import simulate
from minidist.distributed.transport.sim import SimNetwork
from minidist.topology import Topology, TopologyError, parse_topology


def cluster(nodes, ranks_per_node=4, nics=1, gamma=0.0, oversubscription=1.0):
    """A small cluster with round figures: intra 100 GB/s, inter 10 GB/s."""
    return Topology(nodes, ranks_per_node, Params(1e-6, 1e-11, gamma), Params(5e-6, 1e-10, gamma),
                    nics_per_node=nics, spine_oversubscription=oversubscription)


# --------------------------------------------------------------------------- the presets and their text


@pytest.mark.parametrize("name, nics", [("dgx", 8), ("commodity", 1)])
def test_presets_have_a_shape_and_a_source(name, nics):
    preset = topology.PRESETS[name](4)
    assert (preset.nodes, preset.ranks_per_node, preset.nics_per_node) == (4, 8, nics)
    assert preset.world_size == 32 and preset.name == name and preset.source
    assert preset.inter.beta > preset.intra.beta  # the network is the slow part
    assert preset.node_of(15) == 1 and preset.same_node(8, 15) and not preset.same_node(7, 8)
    assert preset.link(0, 7) is preset.intra and preset.link(7, 8) is preset.inter


def test_parse_topology_reads_presets_nodes_and_pairs():
    assert parse_topology("flat") is None
    assert parse_topology("dgx").nodes == 1
    assert parse_topology("dgx", 64).nodes == 8  # the nodes the world fills
    assert parse_topology("dgx:4").world_size == 32
    assert parse_topology("commodity:16").nodes == 16
    custom = parse_topology("nodes=4,ranks_per_node=8,intra=300GB/s,inter=25GB/s,nics=1")
    assert (custom.nodes, custom.ranks_per_node, custom.nics_per_node) == (4, 8, 1)
    assert custom.intra.beta == pytest.approx(1 / 300e9)
    assert custom.inter.beta == pytest.approx(1 / 25e9)
    changed = parse_topology("dgx:4,nics=1,oversubscription=2,inter_alpha=3us")
    assert changed.nics_per_node == 1 and changed.spine_oversubscription == 2
    assert changed.inter.alpha == pytest.approx(3e-6)
    assert changed.inter_beta == pytest.approx(2 * changed.inter.beta)


def test_use_sets_this_process_topology():
    assert topology.current() is None  # flat by default
    try:
        topology.use(topology.dgx(2))
        assert topology.current().nodes == 2
    finally:
        topology.use(None)
    assert topology.current() is None


def test_the_simulated_ranks_see_the_simulated_cluster(monkeypatch):
    from minidist.distributed.collectives import registry
    seen = []
    table = registry.ALGORITHMS["all_reduce"]
    ring = table["ring"]

    def looking(*args, **kwargs):
        seen.append(topology.current())
        return (yield from ring(*args, **kwargs))
    looking.cost = ring.cost
    monkeypatch.setitem(table, "ring", looking)
    made = topology.dgx(2)
    simulate("all_reduce", "ring", 16, 1 << 10, topology=made)
    simulate("all_reduce", "ring", 16, 1 << 10)
    assert seen and seen[0] is made and seen[-1] is None
    assert topology.current() is None


REFUSALS = [
    # (text, world, words of the one line)
    ("dgx", 12, "does not fill whole nodes of 8 ranks"),
    ("dgx:2", 64, "larger than the cluster"),
    ("nodes=2,ranks_per_node=8,intra=0GB/s,inter=1GB/s", None, "is not a positive bandwidth"),
    ("nodes=2,ranks_per_node=8,intra=1GB/s,inter=-1GB/s", None, "is not a positive bandwidth"),
    ("dgx,nics=9", None, "9 NICs a node for 8 ranks a node"),
    ("dgx,oversubscription=0.5", None, "oversubscription 0.5 is below 1"),
    ("hpc", None, "no preset 'hpc'"),
    ("dgx,colour=blue", None, "cannot read 'colour=blue'"),
    ("ranks_per_node=8", None, "say intra, inter"),
]


@pytest.mark.parametrize("text, world, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_one_line_saying_what_to_do(text, world, words):
    with pytest.raises(TopologyError) as caught:
        parse_topology(text, world)
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert "give" in message  # and what to write instead


def test_the_constructor_refuses_too():
    with pytest.raises(TopologyError, match="bandwidth must be positive"):
        Topology(2, 8, Params(1e-6, 0.0), Params(5e-6, 1e-10))
    with pytest.raises(TopologyError, match="nics <= ranks_per_node"):
        Topology(2, 4, Params(1e-6, 1e-11), Params(5e-6, 1e-10), nics_per_node=5)


CLI_REFUSALS = [
    ("simulate all_reduce -n 12 --topology dgx", "does not fill whole nodes"),
    ("simulate all_reduce -n 256 --topology dgx:8", "larger than the cluster"),
    ("simulate all_reduce -n 64 --topology dgx --bandwidth 1GB/s", "--bandwidth would contradict"),
    ("plan --topology dgx:4", "--ranks of 1,024 ranks is larger than the cluster"),
    ("plan --topology dgx --node-size 4", "--node-size would contradict it"),
    ("plan --topology dgx,nics=9", "9 NICs a node"),
]


@pytest.mark.parametrize("command, words", CLI_REFUSALS, ids=[c for c, _ in CLI_REFUSALS])
def test_the_commands_refuse_in_one_line(command, words, capsys):
    assert main(command.split()) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], captured.err


# --------------------------------------------------------------------------- the simulator = the formulas


def _small(nodes, nics, gamma=1e-10):
    return cluster(nodes, 4, nics, gamma=gamma)


#: (collective, algorithm, topology): the ring on each preset and on shared NICs
#: with combining; recursive doubling with a NIC a rank (exact) and across two
#: nodes of one NIC; the binomial broadcast on each preset, the binomial reduce
#: and the all_reduce that does both. Up to 4,096 ranks.
FORMULA_CASES = [
    *[("all_reduce", "ring", make(nodes)) for make in (topology.dgx, topology.commodity)
      for nodes in (1, 2, 16, 512)],
    ("all_reduce", "ring", _small(8, 1)), ("all_reduce", "ring", _small(64, 2)),
    ("reduce_scatter", "ring", _small(8, 2)), ("all_gather", "ring", topology.commodity(16)),
    *[("all_reduce", "recursive_doubling", topology.dgx(nodes)) for nodes in (1, 2, 16, 512)],
    ("all_reduce", "recursive_doubling", _small(16, 4)),
    ("all_reduce", "recursive_doubling", _small(2, 1)),
    *[("broadcast", "binomial", make(nodes)) for make in (topology.dgx, topology.commodity)
      for nodes in (1, 2, 16, 512)],
    ("broadcast", "binomial", _small(5, 2)),
    ("reduce", "binomial", _small(5, 2)), ("reduce", "binomial", topology.commodity(64)),
    ("all_reduce", "reduce_broadcast", topology.dgx(512)),
    ("all_reduce", "reduce_broadcast", _small(16, 1)),
]


#: Two sizes a case; one at 4,096 ranks keeps the file fast.
SIZED = [(*case, nbytes) for case in FORMULA_CASES for nbytes in (64 << 10, 100_000_000)
         if case[2].world_size < 4096 or nbytes == 100_000_000]


@pytest.mark.parametrize("collective, algorithm, made, nbytes", SIZED,
                         ids=[f"{c}-{a}-{t.name or 'small'}-{t.world_size}-{N}"
                              for c, a, t, N in SIZED])
def test_simulated_time_is_the_two_level_formula(collective, algorithm, made, nbytes):
    n = made.world_size
    nbytes = nbytes // n * n  # an array that divides evenly
    result = simulate(collective, algorithm, n, nbytes, topology=made)
    expected = costmodel.predict(collective, algorithm, n, nbytes, topology=made)
    assert result.predicted == pytest.approx(expected, rel=1e-12)
    assert result.time == pytest.approx(expected, rel=1e-9), (n, result.time, expected)


def test_shared_nics_over_several_rounds_make_the_formula_a_lower_bound():
    made = cluster(8, 4, 1)
    result = simulate("all_reduce", "recursive_doubling", 32, 32 << 10, topology=made)
    assert result.predicted <= result.time <= 1.5 * result.predicted


@pytest.mark.parametrize("collective, algorithm, nics", [
    ("all_reduce", "ring", 1), ("all_gather", "ring", 2), ("reduce_scatter", "ring", 1),
    ("all_reduce", "two_shot", 4), ("all_gather", "bruck", 4), ("reduce_scatter", "pairwise", 4),
    ("all_to_all", "pairwise", 4), ("barrier", "dissemination", 4)])
def test_a_node_stands_for_all_nodes_exactly(collective, algorithm, nics):
    made = cluster(4, 4, nics, gamma=1e-10, oversubscription=2)
    one_node = simulate(collective, algorithm, 16, 16 << 10, topology=made)
    every_rank = simulate(collective, algorithm, 16, 16 << 10, topology=made, symmetry=False)
    assert one_node.symmetric and not every_rank.symmetric
    assert one_node.time == every_rank.time and one_node.clocks == every_rank.clocks
    assert (one_node.messages, one_node.bytes) == (every_rank.messages, every_rank.bytes)


def test_shared_nics_outside_a_ring_run_every_rank():
    # Several ranks of a node off the node at once: the order the NIC takes them
    # in is the driver's, which one node cannot stand for; every rank runs.
    made = cluster(4, 4, 2)
    assert not simulate("all_reduce", "two_shot", 16, 16 << 10, topology=made).symmetric
    assert simulate("all_reduce", "ring", 16, 16 << 10, topology=made).symmetric


def test_no_closed_formula_is_said_and_one_node_is_the_flat_formula():
    made = topology.dgx(4)
    with pytest.raises(ValueError, match="no closed two-level formula .* simulate"):
        costmodel.predict("all_reduce", "rabenseifner", 32, 1 << 20, topology=made)
    assert simulate("all_reduce", "rabenseifner", 32, 1 << 20, topology=made).predicted is None
    one = topology.dgx(1)
    flat = costmodel.predict("all_reduce", "rabenseifner", 8, 1 << 20, params=one.intra)
    assert topology_costs.predict("all_reduce", "rabenseifner", 8, 1 << 20, one) == flat


# --------------------------------------------------------------------------- NICs shared


def _off_node_times(made: Topology, pairs, nbytes=1 << 20) -> list[float]:
    """The finish times of the receives of messages sent at once between ``pairs``."""
    network = SimNetwork(made.world_size, 0.0, 0.0, topology=made)
    array = np.zeros(nbytes // 4, np.float32)
    receives = [network.transports[dst].irecv(src, 7) for src, dst in pairs]
    for src, dst in pairs:
        network.transports[src].isend(array, dst, 7)
    for request in receives:
        assert request.test()
    return [request.finish for request in receives]


def test_a_nodes_senders_on_one_nic_take_eight_times_one_senders_time():
    one_nic = topology.commodity(2)
    one = max(_off_node_times(one_nic, [(0, 8)]))
    eight = max(_off_node_times(one_nic, [(r, 8 + r) for r in range(8)]))
    assert one == pytest.approx(one_nic.inter.alpha + (1 << 20) * one_nic.inter.beta)
    assert eight == pytest.approx(8 * one)
    # ... and on the way in: eight nodes' messages reach one NIC one after another
    nine = topology.commodity(9)
    into_one = max(_off_node_times(nine, [(8 * k, k - 1) for k in range(1, 9)]))
    assert into_one == pytest.approx(8 * one)
    # a NIC a rank (a DGX): no wait
    dgx = topology.dgx(2)
    own = _off_node_times(dgx, [(r, 8 + r) for r in range(8)])
    assert max(own) == pytest.approx(dgx.inter.alpha + (1 << 20) * dgx.inter.beta)


def test_the_spine_oversubscription_slows_every_off_node_byte():
    plain = cluster(2, 4, 4)
    half = cluster(2, 4, 4, oversubscription=2)
    (fast,), (slow,) = _off_node_times(plain, [(0, 4)]), _off_node_times(half, [(0, 4)])
    assert slow - half.inter.alpha == pytest.approx(2 * (fast - plain.inter.alpha))


# --------------------------------------------------------------------------- the flat network


def test_the_flat_network_is_the_default_and_unchanged():
    result = simulate("all_reduce", "ring", 64, 1 << 20)
    assert result.topology is None
    assert result.time == pytest.approx(result.predicted, rel=1e-12)
    # a cluster whose two links are the flat one and whose ranks each have a NIC
    link = Params(5e-6, 1e-10, 1e-10)
    same = Topology(8, 8, link, link, nics_per_node=8)
    for algorithm in ("ring", "recursive_doubling", "reduce_broadcast"):
        flat = simulate("all_reduce", algorithm, 64, 1 << 20, alpha=5e-6, beta=1e-10,
                        gamma=1e-10)
        shaped = simulate("all_reduce", algorithm, 64, 1 << 20, topology=same)
        assert shaped.time == pytest.approx(flat.time, rel=1e-12), algorithm
    with pytest.raises(ValueError, match="either topology= or alpha="):
        simulate("all_reduce", "ring", 64, 1 << 20, topology=same, alpha=1e-6)


def test_a_trace_on_a_topology_says_its_shape(tmp_path):
    import json

    path = tmp_path / "ring.jsonl"
    simulate("all_reduce", "ring", 16, 1 << 10, topology=topology.commodity(2), trace=str(path))
    header = json.loads(path.read_text().splitlines()[0])
    assert header["topology"]["nodes"] == 2 and header["topology"]["nics_per_node"] == 1
    assert "topology" not in simulate("all_reduce", "ring", 16, 1 << 10).trace_header()
    # ... and the replay's model column is the two-level formula, read back from it
    from viz.replay import _predict

    result = simulate("all_reduce", "ring", 16, 1 << 20, topology=topology.commodity(2))
    assert _predict(result.trace_header(), "all_reduce", "ring", 16, 1 << 20) == \
        pytest.approx(result.time, rel=1e-12)
