"""The desync report: what every rank was doing when one of them gave up waiting.

Built from the status records of the control block (see :mod:`.control`). A
hung distributed program is almost always two ranks disagreeing about what
comes next (rank 0 waits for a message rank 1 never sends, or both wait to
receive from each other); printing every rank's current operation side by
side makes the disagreement visible, and a few rules name the usual culprits.
"""

from __future__ import annotations

from minidist.runtime import control as ctl


def _peer_text(peer: int) -> str:
    return "any rank" if peer == ctl.ANY else str(peer)


def _tag_text(tag: int) -> str:
    return "any" if tag == ctl.ANY else str(tag)


def _seconds(nanoseconds: int) -> str:
    return f"{max(nanoseconds, 0) / 1e9:.1f} s"


def describe_wait(op: int, peer: int, tag: int, context_name: str, nbytes: int = 0) -> str:
    """'recv from 1, tag 7' / 'send to 3, tag 0, 4096 B (barrier)'."""
    name = ctl.OP_NAMES.get(op, f"op {op}")
    if op == ctl.OP_SEND:
        text = f"send to {_peer_text(peer)}, tag {_tag_text(tag)}"
    elif op in (ctl.OP_RECV, ctl.OP_PROBE):
        text = f"{name} from {_peer_text(peer)}, tag {_tag_text(tag)}"
    elif op == ctl.OP_WAIT_MANY:
        text = "wait on several requests"
    elif op == ctl.OP_COLLECTIVE:
        text = f"a collective, for every rank of its group (shared slots), tag {_tag_text(tag)}"
    else:
        return "nothing"
    if nbytes and op == ctl.OP_SEND:
        text += f", {nbytes} B"
    if context_name:
        text += f" ({context_name})"
    return text


#: Worlds up to this size get a line per rank in the report; bigger ones get
#: the lines that matter (this rank, its peer, the first few) and counts.
LIST_ALL = 16
FIRST_RANKS = 6


def _rank_text(status, now_ns: int, context_name) -> str:
    wait = describe_wait(status.op, status.peer, status.tag, context_name(status.context),
                         status.nbytes)
    if status.state == ctl.WAITING:
        return f"waiting in {wait} for {_seconds(now_ns - status.since_ns)}"
    if status.state == ctl.RUNNING:
        text = "running its own code (not in a minidist call)"
        if status.op != ctl.OP_NONE:
            text += f"; last waited in {wait}, {_seconds(now_ns - status.since_ns)} ago"
        return text
    if status.state == ctl.FINISHED:
        return "finished (returned from its function)"
    if status.state == ctl.FAILED:
        return "failed"
    return "not started yet"


def _state_text(status) -> str:
    """The kind of line a rank would get, without its peer, tag or times."""
    if status.state == ctl.WAITING:
        return f"waiting in a {ctl.OP_NAMES.get(status.op, 'call')}"
    return {ctl.RUNNING: "running their own code", ctl.FINISHED: "finished",
            ctl.FAILED: "failed"}.get(status.state, "not started yet")


def format_report(statuses, me: int, now_ns: int, context_name=lambda context: "") -> str:
    """One line per rank, then hints. ``context_name`` maps a record's context
    number to a readable name ("world", "group 2 / barrier", ...). Past
    :data:`LIST_ALL` ranks, only this rank, the one it waits for and the
    first few get a line; the rest are counted by what they are doing."""
    statuses = list(statuses)
    shown = statuses
    if len(statuses) > LIST_ALL:
        by_rank = {status.rank: status for status in statuses}
        keep = {status.rank for status in statuses[:FIRST_RANKS]} | {me}
        mine = by_rank.get(me)
        if mine is not None and mine.peer in by_rank:
            keep.add(mine.peer)
        shown = [status for status in statuses if status.rank in keep]
    lines = []
    for status in shown:
        marker = "   <- timed out here" if status.rank == me else ""
        lines.append(f"  rank {status.rank}: {_rank_text(status, now_ns, context_name)}{marker}")
    if len(shown) < len(statuses):
        counts: dict[str, int] = {}
        for status in statuses:
            if status not in shown:
                counts[_state_text(status)] = counts.get(_state_text(status), 0) + 1
        rest = ", ".join(f"{count} {what}" for what, count in
                         sorted(counts.items(), key=lambda item: -item[1]))
        lines.append(f"  ... and {len(statuses) - len(shown)} more ranks: {rest}")
    hints = _hints(statuses, me)
    if hints:
        lines.append("")
        lines.extend(f"  hint: {hint}" for hint in hints)
    return "\n".join(lines)


def _hints(statuses, me: int) -> list[str]:
    by_rank = {status.rank: status for status in statuses}
    mine = by_rank.get(me)
    if mine is None or mine.op == ctl.OP_NONE or mine.peer in (ctl.ANY, me):
        return []
    peer = by_rank.get(mine.peer)
    if peer is None:
        return []
    hints = []
    talks_to_me = peer.peer in (me, ctl.ANY)
    if peer.state == ctl.FINISHED:
        hints.append(f"rank {peer.rank} already finished, so it will never answer rank {me}: "
                     "one side has more sends or receives than the other.")
    elif peer.state == ctl.RUNNING:
        hints.append(f"rank {peer.rank} is not communicating: it is still computing, or it "
                     "skipped this exchange (an `if rank == ...` branch?). If it is just slow, "
                     "raise the timeout.")
        if (talks_to_me and peer.op == ctl.OP_SEND and mine.op == ctl.OP_RECV
                and peer.tag != mine.tag and mine.tag != ctl.ANY):
            hints.append(f"rank {peer.rank}'s last message to rank {me} had tag {peer.tag}, "
                         f"but rank {me} waits for tag {mine.tag}.")
    elif peer.state == ctl.WAITING and talks_to_me:
        if mine.op == ctl.OP_RECV and peer.op == ctl.OP_RECV:
            hints.append(f"ranks {me} and {peer.rank} each wait to receive from the other: "
                         "a deadlock. Make one of them send first.")
        elif {mine.op, peer.op} == {ctl.OP_SEND, ctl.OP_RECV}:
            if peer.context != mine.context:
                hints.append(f"ranks {me} and {peer.rank} use different process groups or "
                             "contexts for this exchange.")
            elif ctl.ANY not in (peer.tag, mine.tag) and peer.tag != mine.tag:
                hints.append(f"ranks {me} and {peer.rank} talk to each other with different "
                             f"tags ({mine.tag} and {peer.tag}).")
    return hints
