"""Spinning before sleeping: a shortcut for a rank that has a core of its own.

What it replaces. The progress engine's wait (:meth:`.base.Transport._wait_until`)
goes to sleep as soon as nothing moves: on its doorbell (shm), in ``poll``
(pipe). Waking a sleeper takes a system call on each side and a trip through
the scheduler, which is most of the time of a small message.

What it gains. Before sleeping, a rank keeps making progress for up to
``spin_ns`` of nothing moving (the clock restarts whenever something moves,
so a stream of slots keeps it awake), and sees a message the moment it is
published. It is only worth it when every rank has a core (see
:func:`minidist.distributed.transport.default_spin_ns`): with more ranks than
cores a spinning rank steals the CPU from the very rank it waits for, so
there ``spin_ns`` is 0 and this mixin does nothing.

Nothing a program can observe changes but speed. Installed by the transports
whose shortcuts are on (see :mod:`minidist.distributed.fast_paths`, which
lists every shortcut, and ``MINIDIST_FAST_PATHS=0``, which turns them all off).
"""

from __future__ import annotations

from minidist import trace as _trace

_now = _trace.now


class SpinBeforeSleep:
    """Mixin, before a :class:`~.base.Transport` in the bases: waits spin for
    up to ``_spin_ns`` nanoseconds before the engine's sleeping wait."""

    _spin_ns = 0  # the transport's constructor sets it

    def _wait_until(self, is_done, *args, **kwargs):
        # Written out here rather than in a helper, so that a spinning wait
        # makes no more calls than the engine's own.
        spin_ns = self._spin_ns
        if spin_ns and not is_done():
            self.progress()
            if is_done():
                return
            limit = _now() + spin_ns
            while _now() < limit:
                if self.progress():
                    limit = _now() + spin_ns  # a stream of slots keeps us spinning
                if is_done():
                    return
        super()._wait_until(is_done, *args, **kwargs)
