"""A script run as the main program of a forked copy of ``minidist run``.

``minidist run -n N script.py`` needs N processes that each behave as if
started by ``python script.py``. Starting N fresh interpreters costs each
one Python's start (the interpreter, ``site``, the encodings) and every
module minidist needs again, all while N of them share
the cores. A fork of the launching process already has an interpreter and
whatever the launcher imported before forking; what it must still do is
become that script's main program:

1. its own session (what it forks is in its group, killed when it ends: see
   :mod:`.process_groups`) and death signal (:func:`~.process_setup.die_with_parent`),
   and Python's default signal handlers back (the launcher's turn signals
   into exceptions that would run *its* cleanup);
2. only its own file descriptors: every other one the launcher holds (other
   ranks' pipes above all) is closed, as ``subprocess``'s ``pass_fds`` did:
   a pipe end left open in a sibling would keep a dead rank's peer waiting;
3. the environment, ``sys.argv`` and ``sys.path[0]`` a ``python script.py``
   sees, and a fresh ``__main__`` module to run the script in;
4. the end of an interpreter: wait for the script's non-daemon threads, run
   its ``atexit`` functions, flush stdout and stderr, then ``os._exit`` with
   the exit code Python would have used. What it skips is tearing the
   interpreter down (freeing every module, NumPy's too): the kernel frees a
   process faster.

The child never returns into the launcher's code: whatever happens, it ends
in ``os._exit``.

Cost: one ``fork`` per rank in the launcher (page tables of the launcher's
small image: a fraction of a millisecond) instead of an interpreter start and
the same imports in every rank.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time

from minidist.runtime import process_groups, signals
from minidist.runtime.process_setup import close_fds_except, die_with_parent


class ForkedProgram:
    """The launcher's handle on one forked program: what ``subprocess.Popen``
    offers the supervisor (``pid``, ``returncode``, ``poll``, ``wait``,
    ``terminate``, ``kill``)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and process_groups.has_ended(self.pid):
            self._collect()
        return self.returncode

    def _collect(self) -> None:
        """It has ended: kill what it left in its group (while its pid is still
        its own, see :mod:`.process_groups`), then collect its status."""
        process_groups.end_group(self.pid)
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return
        self.returncode = os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``TimeoutError`` if the program still runs after ``timeout`` s."""
        if timeout is None:
            if self.returncode is None:
                process_groups.wait_ended(self.pid)
                self._collect()
            return self.returncode
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # reaped: the pid may be someone else's now
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(script: str, args: list[str], env: dict[str, str], keep_fds) -> ForkedProgram:
    """Fork; the child runs ``script`` with ``args`` as its ``__main__`` (never
    returning here), keeping only stdin, stdout, stderr and ``keep_fds``."""
    sys.stdout.flush()  # or what is buffered would be written once more by the child
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return ForkedProgram(pid)
    code = 1
    try:
        code = _become(script, args, env, keep_fds, parent)
    except BaseException:  # noqa: BLE001 - becoming the program failed: say how, exit 1
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _become(script, args, env, keep_fds, parent) -> int:
    """In the child: steps 1 to 4 of the module's docstring; returns the exit code."""
    os.setsid()
    die_with_parent()
    if os.getppid() != parent:
        return 1  # the launcher died before the death signal was armed
    signals.reset_in_program()
    # (The launcher's segment reaper's pipe goes too: a rank that makes a
    # segment of its own forks its own reaper, see segment_reaper.)
    close_fds_except({0, 1, 2, *keep_fds})
    _fresh_stdio()
    _fresh_logging()
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script, *args]  # as given; __file__ and sys.path[0] are absolute
    script = os.path.abspath(script)
    sys.path[0] = os.path.dirname(script)
    # The launcher's exit functions are not the script's; logging's is what
    # an interpreter that imported logging has, so it stays.
    atexit._clear()
    if "logging" in sys.modules:
        atexit.register(sys.modules["logging"].shutdown)
    return finish_interpreter(_run_main(script))


def _fresh_stdio() -> None:
    """stdout and stderr on file descriptors 1 and 2, as an interpreter starts
    with. A launcher called from inside another program (a test runner that
    captures output, a notebook) may have replaced them with objects that
    write elsewhere, through descriptors closed here."""
    import io

    def on(stream, fd) -> bool:
        try:
            return stream is not None and stream.fileno() == fd
        except (AttributeError, OSError, ValueError):
            return False

    for name, fd in (("stdout", 1), ("stderr", 2)):
        if on(getattr(sys, name), fd):
            continue
        original = getattr(sys, f"__{name}__")  # the interpreter's own, if still there
        if on(original, fd):
            setattr(sys, name, original)
            continue
        try:
            binary = io.open(fd, "wb", closefd=False)
        except OSError:
            continue  # no such descriptor: as Python, no stream
        setattr(sys, name, io.TextIOWrapper(binary, encoding="utf-8",
                                            errors="backslashreplace" if fd == 2 else "strict",
                                            line_buffering=fd == 2 or os.isatty(fd)))


def _fresh_logging() -> None:
    """No handlers and the root at WARNING, as in a new interpreter: the
    launcher's host program may have configured logging (a test runner's
    capture, a notebook's handlers), and a script's records must not go there."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    for logger in loggers:
        logger.handlers.clear()
    logging.getLogger().setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def _run_main(script: str) -> int:
    """Run the script as ``__main__``; the exit code ``python script.py`` would have."""
    import builtins
    import types

    try:
        with open(script, "rb") as file:
            source = file.read()
    except OSError as error:  # one line and status 2, as `python script.py` says it
        sys.stderr.write(f"minidist run: can't open file {script!r}: [Errno {error.errno}] "
                         f"{error.strerror}\n")
        return 2
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = main
    try:
        exec(compile(source, script, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as stop:
        return _exit_code(stop.code)
    except KeyboardInterrupt as error:
        _report(error)
        return -signal.SIGINT
    except BaseException as error:  # noqa: BLE001 - reported as Python reports it
        _report(error)
        return 1
    return 0


def _report(error: BaseException) -> None:
    """``sys.excepthook`` with the traceback starting in the script, as Python
    shows it (without this module's frame that ran it)."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code is _run_main.__code__:
        tb = tb.tb_next
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _exit_code(value) -> int:
    """``sys.exit(value)``'s exit status, as the interpreter computes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        sys.stderr.write(f"{value}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def finish_interpreter(code: int) -> int:
    """What an interpreter does at its exit before tearing itself down: wait
    for non-daemon threads, run the ``atexit`` functions, flush stdout and
    stderr. Returns the exit code to give ``os._exit`` (120 if a flush
    failed, as Python's). Also the ``minidist`` command's end after a run."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # non-daemon threads end first, as at any exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - e.g. a closed pipe: Python exits 120
            code = code or 120
    if code == -signal.SIGINT:
        # Python ends an interrupted program by SIGINT itself, so its parent
        # sees the signal; do the same.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    return code
