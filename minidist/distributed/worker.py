"""The life of one worker made by :func:`minidist.launch` (a forked process).

Set up (its own session, so that what it forks can be ended with it; die
with the parent; own pipe ends only, logging,
tracing, transport), run the user's function, then report exactly one message
to the parent over a private pipe (after the log records the rank sent on it,
see :mod:`minidist.runtime.console`)::

    ("ok", rank, return value, trace events)
    ("error", rank, kind, exception type, message, traceback text, trace events, blamed rank,
     when it failed (time.monotonic(): one clock for every process of the machine))

``kind`` is "exception", "timeout" or "aborted" (stopped because another rank
failed: the parent does not report those as the cause).
"""

from __future__ import annotations

import pickle
import time
import traceback

from minidist import trace as _trace
from minidist.distributed import world
from minidist.runtime import console
from minidist.runtime import control as ctl
from minidist.runtime.errors import AbortedError, CommTimeoutError
from minidist.runtime.process_groups import lead_own_session
from minidist.runtime.process_setup import prepare_worker_process


def worker_main(rank, world_size, fn, args, kwargs, resources, control, result_pipe, options):
    connection = result_pipe.writer
    result_pipe.reader.close()
    lead_own_session()  # first: a child forked from here on is in the worker's group
    prepare_worker_process(options["parent_pid"])
    resources.after_fork(rank)
    for other in options["other_pipes"]:
        other.close_in_child()
    logs = console.configure_worker_logging(rank, options["log_level"], connection,
                                            handler=options.get("log_handler"))
    if options["trace"]:
        _trace.start_recording(rank)
    try:
        current = world.start_worker(rank, world_size, resources, control, options["timeout"],
                                     "launch")
        current.shared_arrays = options["shared_arrays"].views()
        result = fn(*args, **kwargs)
        world.finish_worker()
        outcome = ("ok", rank, result, _trace.stop_recording())
        try:
            payload = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise TypeError(
                f"rank {rank} returned a {type(result).__name__} that cannot be pickled "
                f"({error}); return arrays, numbers or other plain data") from error
    except BaseException as error:  # noqa: B036 - everything must be reported, even SystemExit
        failed_at = time.monotonic()
        world.mark_failed()
        if world.is_initialized():
            try:
                world.current().close_transport()
            except Exception:
                pass
            world._world = None
        control.set_state(rank, ctl.FAILED, _trace.now())
        if isinstance(error, AbortedError):
            kind = "aborted"
        elif isinstance(error, CommTimeoutError):
            kind = "timeout"
        else:
            kind = "exception"
        # A PeerGoneError names the rank it waited for: the launcher follows
        # these back to the rank that really caused the failure. A
        # CollectiveMismatchError names the rank whose call differs from the
        # majority's: the launcher names it, whoever noticed.
        odd = getattr(error, "odd", ())
        blamed = odd[0] if odd else getattr(error, "peer", None)
        outcome = ("error", rank, kind, type(error).__name__, str(error), traceback.format_exc(),
                   _trace.stop_recording(), blamed, failed_at)
        payload = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        logs.send_last(payload)  # after every record: the parent prints them first
    except OSError:
        pass  # the parent is gone; the death signal will end us
    finally:
        connection.close()
