"""A cluster with a shape: nodes of ranks, fast links inside a node, NICs between.

The flat model (:mod:`minidist.alpha_beta`) gives every pair of ranks the
same link, ``t = alpha + m beta``. A real cluster has two levels:

* inside a **node**, ranks (GPUs) talk over NVLink or PCIe: the ``intra``
  link, fast and private to each pair;
* between nodes, a message leaves through one of the node's **NICs** and
  crosses the network: the ``inter`` link, slower, and shared: the
  ``ranks_per_node`` ranks of a node share its ``nics_per_node`` NICs for
  all their off-node messages, in both directions. With one NIC and 8 ranks
  sending off-node at once, the 8 messages leave one after another: 8 times
  one message's time.
* The **spine** (the switches above the NICs) may carry less than all the
  NICs together: an ``spine_oversubscription`` of x means it carries 1/x of
  their total, so that with every NIC busy each off-node byte takes x times
  as long. The model applies x to every off-node message (the worst case,
  all NICs busy at once, which is what a ring or an all-to-all across nodes
  does).

Ranks are numbered node by node: ranks ``k R .. k R + R - 1`` (R ranks per
node) are node k, as ``torchrun`` numbers them (and as NCCL expects for its
rings to leave a node once). Within a node, ranks use the NICs in contiguous
blocks: with 8 ranks and 2 NICs, ranks 0-3 the first, 4-7 the second (a
DGX has one NIC beside each GPU, each GPU its own).

The presets' figures are a vendor's or NCCL's, rounded to what they say; the
latencies are orders of magnitude (NCCL's own tuning model,
``src/graph/tuning.cc``, puts a hop at about 0.5 to 3.4 microseconds over
NVLink, 1 to 6 over PCIe, and 3 to 14 over the network, by protocol).
Reductions (gamma) belong to the rank, not to a link: they are read from
``intra``; the GPU presets set them to 0 (an H100 adds from its memory far
faster than any link brings the bytes).

Imports only :mod:`minidist.alpha_beta`: the simulator, the cost model and
the planner above all read their cluster from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from minidist.alpha_beta import Params, parse_bandwidth, parse_time


class TopologyError(ValueError):
    """A topology that cannot be (or cannot hold the world asked of it)."""


@dataclass(frozen=True)
class Topology:
    """``nodes`` of ``ranks_per_node`` ranks each; ``intra`` the link inside a
    node, ``inter`` a NIC's link between nodes; the ``nics_per_node`` NICs a
    node's ranks share for their off-node messages; the spine's
    ``spine_oversubscription`` (>= 1). ``name`` and ``source``: what the
    preset is, and where its figures come from."""

    nodes: int
    ranks_per_node: int
    intra: Params
    inter: Params
    nics_per_node: int = 1
    spine_oversubscription: float = 1.0
    name: str = ""
    source: str = ""

    def __post_init__(self):
        for field_name in ("nodes", "ranks_per_node", "nics_per_node"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TopologyError(f"topology: {field_name} must be a whole number >= 1, got "
                                    f"{value!r}")
        for link_name in ("intra", "inter"):
            link = getattr(self, link_name)
            if not (link.alpha >= 0 and math.isfinite(link.alpha)):
                raise TopologyError(f"topology: the {link_name} latency must be >= 0 seconds, "
                                    f"got {link.alpha!r}")
            if not (link.beta > 0 and math.isfinite(link.beta)):
                raise TopologyError(f"topology: the {link_name} bandwidth must be positive and "
                                    f"finite (beta {link.beta!r} s/B); give it in bytes per "
                                    "second, such as 25GB/s")
        if self.nics_per_node > self.ranks_per_node:
            raise TopologyError(
                f"topology: {self.nics_per_node} NICs a node for {self.ranks_per_node} ranks a "
                "node: each NIC serves at least one rank; give nics <= ranks_per_node")
        if not self.spine_oversubscription >= 1:
            raise TopologyError(
                f"topology: spine oversubscription {self.spine_oversubscription!r} is below 1: "
                "it is the NICs' total over what the spine carries (1: non-blocking, 2: half); "
                "give a number >= 1")

    # ------------------------------------------------------------------ where a rank is

    @property
    def world_size(self) -> int:
        """Every rank of the cluster: nodes * ranks_per_node."""
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node of ``rank`` (consecutive ranks share a node)."""
        return rank // self.ranks_per_node

    def same_node(self, a: int, b: int) -> bool:
        return a // self.ranks_per_node == b // self.ranks_per_node

    def link(self, a: int, b: int) -> Params:
        """The link a message from rank ``a`` to rank ``b`` crosses."""
        return self.intra if a // self.ranks_per_node == b // self.ranks_per_node else self.inter

    def nic_of(self, rank: int) -> int:
        """The NIC (numbered over the whole cluster) that ``rank``'s off-node
        messages leave and arrive through: its node's NICs in contiguous blocks."""
        node, local = divmod(rank, self.ranks_per_node)
        return node * self.nics_per_node + local * self.nics_per_node // self.ranks_per_node

    @property
    def ranks_per_nic(self) -> int:
        """The most ranks one NIC serves (ceil(ranks_per_node / nics_per_node))."""
        return -(-self.ranks_per_node // self.nics_per_node)

    @property
    def inter_beta(self) -> float:
        """Seconds per off-node byte: the NIC's beta times the spine's oversubscription."""
        return self.inter.beta * self.spine_oversubscription

    @property
    def gamma(self) -> float:
        """Seconds per byte a rank combines (a rank's, read from ``intra``)."""
        return self.intra.gamma

    def nodes_used(self, world_size: int) -> int:
        """The nodes the first ``world_size`` ranks occupy."""
        return -(-world_size // self.ranks_per_node)

    # ------------------------------------------------------------------ a world on it

    def check_world(self, world_size: int, what: str = "the world") -> None:
        """Refuse (TopologyError, one line) a world this cluster cannot hold:
        more ranks than it has, or a number of ranks that fills no whole nodes."""
        if world_size > self.world_size:
            raise TopologyError(
                f"{what} of {world_size:,} ranks is larger than the cluster ({self.describe()}: "
                f"{self.world_size:,} ranks); give more nodes (such as "
                + (f"{self.name.rstrip('+')}:" if self.name else "nodes=")
                + f"{-(-world_size // self.ranks_per_node)}) or fewer ranks")
        if world_size % self.ranks_per_node:
            raise TopologyError(
                f"{what} of {world_size:,} ranks does not fill whole nodes of "
                f"{self.ranks_per_node} ranks; give a multiple of {self.ranks_per_node} ranks "
                f"(such as {max(self.ranks_per_node, world_size // self.ranks_per_node * self.ranks_per_node):,})")

    def describe(self) -> str:
        """One line: the shape and the links."""
        def rate(beta):
            return _rate(1.0 / beta)
        spine = (f", spine 1:{self.spine_oversubscription:g}"
                 if self.spine_oversubscription != 1 else "")
        name = f"{self.name}: " if self.name else ""
        return (f"{name}{self.nodes} x {self.ranks_per_node} ranks, intra {rate(self.intra.beta)}"
                f" alpha {self.intra.alpha * 1e6:g}us, inter {rate(self.inter.beta)} alpha "
                f"{self.inter.alpha * 1e6:g}us, {self.nics_per_node} NIC"
                f"{'s' if self.nics_per_node > 1 else ''} a node{spine}")


def _rate(bytes_per_second: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:g}{unit}"
    return f"{bytes_per_second:g}B/s"


# --------------------------------------------------------------------------- presets


def dgx(nodes: int = 1) -> Topology:
    """NVIDIA DGX H100 nodes: 8 GPUs on NVLink, 8 NICs of 400 Gb/s, one per GPU."""
    return Topology(
        nodes=nodes, ranks_per_node=8,
        # NVLink: the datasheet counts both directions together; a link here is one way.
        intra=Params(alpha=1e-6, beta=1 / 450e9, gamma=0.0),
        # ConnectX-7 InfiniBand, in bytes (the datasheet gives bits).
        inter=Params(alpha=5e-6, beta=1 / 50e9, gamma=0.0),
        nics_per_node=8, name="dgx",
        source="NVIDIA DGX H100 datasheet (8x H100, 900 GB/s NVLink a GPU, 8x ConnectX-7 "
               "400 Gb/s InfiniBand); latencies: the order of magnitude of NCCL's "
               "src/graph/tuning.cc (hwLat, NVLink and network)")


def commodity(nodes: int = 1) -> Topology:
    """8 GPUs a node on PCIe 4.0 x16, one 100 Gb Ethernet NIC for the node."""
    return Topology(
        nodes=nodes, ranks_per_node=8,
        # PCIe 4.0 x16: the lanes' transfer rate less its 128b/130b coding, one way.
        intra=Params(alpha=2e-6, beta=1 / 32e9, gamma=0.0),
        # 100 GbE, in bytes, shared by the node's ranks (one NIC).
        inter=Params(alpha=10e-6, beta=1 / 12.5e9, gamma=0.0),
        nics_per_node=1, name="commodity",
        source="PCI-SIG PCIe 4.0 specification (16 GT/s a lane, x16); IEEE 802.3 100 Gb "
               "Ethernet; latencies: the order of magnitude of NCCL's src/graph/tuning.cc "
               "(hwLat, PCI and network)")


#: name -> (nodes -> Topology).
PRESETS: dict[str, Callable[[int], Topology]] = {"dgx": dgx, "commodity": commodity}

#: The keys of the ``key=value`` form, and the Topology field each sets.
_KEYS = {"nodes": "nodes", "ranks_per_node": "ranks_per_node", "intra": "intra",
         "inter": "inter", "intra_alpha": "intra_alpha", "inter_alpha": "inter_alpha",
         "nics": "nics_per_node", "nics_per_node": "nics_per_node",
         "oversubscription": "spine_oversubscription",
         "spine_oversubscription": "spine_oversubscription", "gamma": "gamma"}

#: Latencies of a ``key=value`` topology that names none (NCCL's orders of magnitude).
DEFAULT_INTRA_ALPHA = 1e-6
DEFAULT_INTER_ALPHA = 5e-6

HELP = ("'flat', a preset ('dgx', 'commodity', with ':NODES' such as 'dgx:4'), or "
        "key=value pairs: nodes=4,ranks_per_node=8,intra=300GB/s,inter=25GB/s,nics=1 "
        "(also intra_alpha=1us, inter_alpha=5us, oversubscription=2, gamma=10GB/s); a preset "
        "may be followed by pairs that change it: 'dgx:4,nics=1'")


def parse_topology(text: str, world_size: int | None = None, *,
                   what: str = "the world") -> Topology | None:
    """The topology ``text`` names (see :data:`HELP`); None for ``"flat"``.

    Without a node count, the nodes are those ``world_size`` ranks fill (one
    node when no world is given). With ``world_size``, the world is checked
    to fit (:meth:`Topology.check_world`; ``what`` names it in the refusal). Every mistake is a TopologyError
    of one line saying what to write instead."""
    text = str(text).strip()
    if text.lower() in ("", "flat", "none"):
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    base = None
    if parts and "=" not in parts[0]:
        name, _, nodes_text = parts.pop(0).partition(":")
        name = name.strip().lower()
        if name not in PRESETS:
            raise TopologyError(f"--topology {text!r}: no preset {name!r}; give {HELP}")
        base = PRESETS[name](1)
        if nodes_text:
            parts.insert(0, f"nodes={nodes_text}")
    values: dict = {}
    for part in parts:
        key, equals, value = (piece.strip() for piece in part.partition("="))
        if not equals or key.lower() not in _KEYS:
            raise TopologyError(f"--topology {text!r}: cannot read {part!r}; give {HELP}")
        values[_KEYS[key.lower()]] = _value(text, key, value)
    if base is None:
        missing = [key for key in ("ranks_per_node", "intra", "inter") if key not in values]
        if missing:
            raise TopologyError(f"--topology {text!r}: say {', '.join(missing)} (or start "
                                f"from a preset); give {HELP}")
        base = Topology(nodes=1, ranks_per_node=values["ranks_per_node"],
                        intra=Params(DEFAULT_INTRA_ALPHA, 1 / values["intra"]),
                        inter=Params(DEFAULT_INTER_ALPHA, 1 / values["inter"]))
    ranks_per_node = values.get("ranks_per_node", base.ranks_per_node)
    nodes = values.get("nodes")
    if nodes is None:
        nodes = max(1, -(-world_size // ranks_per_node)) if world_size else 1
    intra, inter = base.intra, base.inter
    if "intra" in values:
        intra = replace(intra, beta=1 / values["intra"])
    if "inter" in values:
        inter = replace(inter, beta=1 / values["inter"])
    if "intra_alpha" in values:
        intra = replace(intra, alpha=values["intra_alpha"])
    if "inter_alpha" in values:
        inter = replace(inter, alpha=values["inter_alpha"])
    if "gamma" in values:
        intra = replace(intra, gamma=1 / values["gamma"])
        inter = replace(inter, gamma=1 / values["gamma"])
    changed = set(values) - {"nodes"}
    topology = Topology(
        nodes=nodes, ranks_per_node=ranks_per_node, intra=intra, inter=inter,
        nics_per_node=values.get("nics_per_node", min(base.nics_per_node, ranks_per_node)),
        spine_oversubscription=values.get("spine_oversubscription",
                                          base.spine_oversubscription),
        name=base.name + ("+" if changed and base.name else ""),
        source=base.source)
    if world_size is not None:
        topology.check_world(world_size, what)
    return topology


def _value(text: str, key: str, value: str):
    """One ``key=value``'s value, read by its kind, or a one-line refusal."""
    kind = _KEYS[key.lower()]
    try:
        if kind in ("nodes", "ranks_per_node", "nics_per_node"):
            number = int(value)
            if number < 1:
                raise ValueError
            return number
        if kind in ("intra", "inter", "gamma"):
            number = parse_bandwidth(value)
            if not (number > 0 and math.isfinite(number)):
                raise TopologyError(f"--topology {text!r}: {key}={value} is not a positive "
                                    "bandwidth; give one such as 25GB/s")
            return number
        if kind in ("intra_alpha", "inter_alpha"):
            number = parse_time(value)
            if not (number >= 0 and math.isfinite(number)):
                raise ValueError
            return number
        number = float(value)  # the spine's oversubscription: checked by Topology
        return number
    except TopologyError:
        raise
    except ValueError:
        what = {"nodes": "a whole number >= 1", "ranks_per_node": "a whole number >= 1",
                "nics_per_node": "a whole number >= 1", "intra_alpha": "a time such as 1us",
                "inter_alpha": "a time such as 5us", "spine_oversubscription": "a number >= 1",
                "intra": "a bandwidth such as 300GB/s", "inter": "a bandwidth such as 25GB/s",
                "gamma": "a bandwidth such as 100GB/s"}[kind]
        raise TopologyError(f"--topology {text!r}: {key}={value!r}: give {what}") from None


# --------------------------------------------------------------------------- this process's

_CURRENT: list = [None]


def use(topology: Topology | None) -> None:
    """Set this process's topology (None: the flat network): the cluster an
    algorithm that asks :func:`current` runs on. The simulator sets it to its
    own ``topology=`` while its ranks run, and puts the old one back."""
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"use() takes a Topology or None, got {type(topology).__name__}; "
                        "read one from text with parse_topology()")
    _CURRENT[0] = topology


def current() -> Topology | None:
    """This process's topology (None: flat), as :func:`use` set it."""
    return _CURRENT[0]
