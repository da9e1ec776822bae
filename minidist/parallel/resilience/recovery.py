"""Recovery: a replica that joins receives the weights and the optimizer's state.

torchft heals a replica that (re)starts: at the quorum that admits it, a
live replica sends it the model's and the optimizer's ``state_dict``, and
from the next all_reduce on it trains as the others do. The same here, at
a step boundary: the quorum (:mod:`.quorum`) names the joining ranks and
the *source*, the lowest replica that holds the weights, and the source
sends each of them, point to point, everything a step depends on:

* the ``state_dict`` the manager was given (the weights, the optimizer's
  moments and step counts: AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``),
* the steps committed and the history of quorums (so that the replica that
  joins knows, as the others do, how many steps were short-handed).

A hot spare, not a new process. torchft restarts a dead replica's process,
which then asks the lighthouse to join. minidist's transports connect every
pair of ranks when a run starts (a pipe per ordered pair, a ring of shared
slots per pair), and a process born later has no links. So the launcher
starts the replacement at the beginning, as a *spare* rank
(``launch(world_size=5)`` with four replicas: rank 4 waits, taking part
only in the agreements, until the group is short), and recovery turns it
into a replica. What it shows is the same: a replica that held nothing
joins at a step boundary and the group goes on at full strength; what it
does not show is the cost of starting a process and importing a program.

The first quorum heals too (torchft's ``init_sync``): every replica but the
lowest receives the lowest's state, so replicas built from different seeds
start equal.

Cost per joining rank: one message of the pickled state (P weights plus
the optimizer's state, 3 P for AdamW) from the source, alpha + 3 P beta;
the group waits for it once, at the step it joins.
"""

from __future__ import annotations

import copy

import minidist.distributed as dist
from minidist import trace

#: The tag of the state a source sends.
STATE_TAG = 17


def recovery_group(quorum):
    """The group the state travels in: the quorum's members, in a context of
    its own (made by the members only)."""
    return dist.new_group(quorum.members, use_local_synchronization=True,
                          group_desc="recovery")


def send_state(quorum, state: dict) -> None:
    """The source: send ``state`` to every joining rank of ``quorum``."""
    group = recovery_group(quorum)
    for rank in quorum.joining:
        label = trace.with_info("recovery send", kind="recovery", step=quorum.step, to=rank)
        with trace.region(label, kind="recovery"):
            group.send_object(state, group.group_rank(rank), tag=STATE_TAG)


def receive_state(quorum) -> dict:
    """A joining rank: the state the source sends (``PeerGoneError`` if the
    source dies first: the next quorum names another)."""
    group = recovery_group(quorum)
    label = trace.with_info("recovery receive", kind="recovery", step=quorum.step,
                            source=quorum.source)
    with trace.region(label, kind="recovery"):
        return group.recv_object(group.group_rank(quorum.source), tag=STATE_TAG)


def snapshot(state: dict) -> dict:
    """A copy that later steps do not change (the state before a step, kept
    to roll it back; arrays are copied, not shared)."""
    return copy.deepcopy(state)
