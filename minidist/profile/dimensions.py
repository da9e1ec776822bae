"""A rank's communication by the mesh dimension it ran along (dp, tp, pp, ...).

A 3D run's header names its device mesh (``mesh_shape``, ``mesh_dim_names``,
as :func:`minidist.distributed.device_mesh.trace_header` writes them). The
ranks sit on the mesh row-major, as ``init_device_mesh`` lays them out, so a
message's two ranks differ in one coordinate: that is its dimension. A
collective call carries its group's id, and a group's dimension is that of
its messages (the rule the timeline colours by, :mod:`viz.timeline`). A
trace without a mesh is grouped by group id instead ("group 0" the world).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from minidist import trace as _trace
from minidist.profile.intervals import Interval, intersect, length, subtract, union

COMMUNICATION_KINDS = frozenset({"send", "recv", "collective"})


@dataclass
class Dimension:
    """One rank's communication along one mesh dimension (or group): its
    intervals, and the parts of them overlapped, exposed and waiting as the
    rank's own classes cut them. Dimensions may run at once (a tp all_reduce
    while a pp send is in flight): their times need not add up to the rank's."""

    name: str
    rank: int
    communication: list[Interval]
    overlapped: list[Interval]
    exposed: list[Interval]
    waiting: list[Interval]
    calls: int

    def ns(self, name: str) -> int:
        return length(getattr(self, name))


def header_mesh(header: dict):
    """(shape, names) of the device mesh the header names, or None."""
    shape = header.get("mesh_shape")
    if not shape:
        return None
    names = header.get("mesh_dim_names") or [f"dim {d}" for d in range(len(shape))]
    return tuple(int(n) for n in shape), tuple(str(n) for n in names)


def _coordinates(rank: int, shape) -> tuple[int, ...]:
    found = []
    for size in reversed(shape):
        rank, place = divmod(rank, size)
        found.append(place)
    return tuple(reversed(found))


def message_dimension(rank: int, peer, shape, names) -> str | None:
    """The dimension a message between ``rank`` and ``peer`` runs along, or
    None when their coordinates differ in more than one (or either is off the mesh)."""
    size = 1
    for n in shape:
        size *= n
    if peer is None or not (0 <= rank < size and 0 <= peer < size):
        return None
    differ = [d for d, (a, b) in enumerate(zip(_coordinates(rank, shape),
                                               _coordinates(peer, shape))) if a != b]
    return names[differ[0]] if len(differ) == 1 else None


def event_dimensions(events: list[dict], shape, names) -> list[str | None]:
    """The dimension of each communication event: a message's own, a call's its group's."""
    seen = defaultdict(set)
    for event in events:
        if event["kind"] in ("send", "recv"):
            seen[event.get("group", 0)].add(
                message_dimension(event["rank"], event.get("peer"), shape, names))
    of_group = {group: dims.pop() for group, dims in seen.items() if len(dims) == 1}
    return [of_group.get(e.get("group", 0)) if e["kind"] == "collective"
            else message_dimension(e["rank"], e.get("peer"), shape, names) for e in events]


def communication_by_dimension(events, header, ranks) -> tuple[str, dict]:
    """Each rank's communication grouped by the mesh dimension it ran along
    (the header names the mesh: :func:`event_dimensions`), or else by its
    group's id; a collective's own messages go with the call."""
    communication = [e for e in events if e["kind"] in COMMUNICATION_KINDS]
    mesh = header_mesh(header)
    if mesh is not None:  # a call's dimension is learnt from its group's messages: all of them
        names = [dim or "other" for dim in event_dimensions(communication, *mesh)]
        rule = f"by mesh dimension ({' x '.join(mesh[1])} = {' x '.join(map(str, mesh[0]))})"
    else:
        names = [f"group {e.get('group', 0)}" if e["kind"] == "collective"
                 else f"point-to-point, group {e.get('group', 0)}" for e in communication]
        rule = "by group (the trace's header names no device mesh)"
    grouped: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for event, name in zip(communication, names):
        if event["kind"] != "collective" and "call" in _trace.label_info(event.get("label") or ""):
            continue  # a collective's message: inside its call's event already
        grouped[name][event["rank"]].append(event)
    found = {}
    for name in sorted(grouped):
        found[name] = {}
        for rank, mine in sorted(grouped[name].items()):
            b = ranks[rank]
            times = union((e["start"], e["end"]) for e in mine)
            waiting = intersect(times, b.waiting)
            overlapped = intersect(times, b.compute)
            found[name][rank] = Dimension(name, rank, times, overlapped,
                                          subtract(subtract(times, b.compute), waiting), waiting,
                                          sum(e["kind"] == "collective" for e in mine))
    return rule, found
