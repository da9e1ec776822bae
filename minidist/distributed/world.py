"""This process's place in the run: its rank, the world group, its transport.

Four ways a process becomes a rank:

* :func:`minidist.launch` forks workers and initializes each one before
  calling the user's function (``init_process_group()`` inside it is then a
  no-op, so the same code runs under both launchers);
* ``minidist run -n N script.py`` starts N programs with ``MINIDIST_RANK``,
  ``MINIDIST_WORLD_SIZE``, ``MINIDIST_TRANSPORT`` and ``MINIDIST_RUN`` (where to
  find the shared resources) in their environment; the script calls
  :func:`init_process_group`, which reads them;
* ``mpiexec -n N python script.py`` (MPICH or Open MPI): the script calls
  :func:`init_process_group`, which sees mpiexec's variables (``PMI_RANK``,
  ``OMPI_COMM_WORLD_RANK``, ...) and joins over the mpi transport; a rank
  that raises names itself and its error, then ends the job (MPI_Abort);
* ``init_process_group(world_size=1)`` with no launcher: a world of one, so a
  script can also run alone.

torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) is read where minidist can honour it:
``minidist run`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` for scripts
written for torchrun, and a torchrun world of one runs alone. A torchrun world
of several cannot join: minidist's ranks meet through memory and pipes their
launcher creates, not through a TCP rendezvous at MASTER_ADDR, so
:func:`init_process_group` says to start the script with ``minidist run`` or
``mpiexec`` instead.

Groups. :func:`new_group` must be called by every rank, in the same order,
with the same ranks (as in torch.distributed): each call numbers the group,
and that number, identical everywhere, keeps its messages apart.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING

from minidist import trace as _trace
from minidist.runtime import control as ctl
from minidist.runtime import membership
from minidist.runtime.errors import NotInitializedError

DEFAULT_TIMEOUT = 120.0
"""Seconds a blocking call may wait before it fails with a desync report."""

_TORCH_BACKENDS = ("gloo", "nccl", "mpi", "ucc")

if TYPE_CHECKING:
    from minidist.distributed.process_group import ProcessGroup

# The process group (and with it NumPy and the transports' engine) is imported
# where a group is made or checked, not here: `minidist run`'s launching
# process imports this module for its constants while its workers start, and
# every import there delays them.


class World:
    """What an initialized process knows about its run.

    Its ``transport`` and world ``group`` are made when first used, not when
    the process joins: a rank whose function sends nothing (a trivial launch,
    a script that only asks its rank) never connects, and connecting is a
    large share of a warm launch (the objects a transport builds touch pages
    that a forked worker must copy first; bench_launch.py measures it)."""

    def __init__(self, rank, world_size, control, resources, mode, connect):
        self.rank = rank
        self.world_size = world_size
        self.control = control
        self.resources = resources
        self.mode = mode  # "launch", "run", "mpi" or "single"
        self.groups_created = 0
        self.failed = False
        self.trace_dir = None
        self.shared_arrays = {}  # name -> array over shared memory (see shared_array.py)
        self._connect = connect  # () -> this rank's transport

    def __getattr__(self, name):
        # Called only for an attribute not set yet: once made, the transport
        # and the group are plain attributes, so the calls that use them pay
        # nothing for their having been made late.
        if name == "transport":
            from minidist.distributed.process_group import describe_context

            transport = self.__dict__["_connect"]()
            transport.describe_context = describe_context
            self.transport = transport
            return transport
        if name == "group":
            from minidist.distributed.process_group import ProcessGroup

            self.group = ProcessGroup(self.transport, range(self.world_size), 0)
            return self.group
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def connected(self) -> bool:
        """Whether this rank's transport has been made (see the class docstring)."""
        return "transport" in self.__dict__

    def close_transport(self) -> None:
        """Close the transport, or what this rank holds of the run if it never
        connected (its pipe ends: a peer writing to it must see it gone)."""
        if self.connected:
            self.transport.close()
        else:
            self.resources.close_unconnected()


_world: World | None = None


def current() -> World:
    if _world is None:
        raise NotInitializedError()
    return _world


def is_initialized() -> bool:
    return _world is not None


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return None if timeout is None else float(timeout)


# --------------------------------------------------------------------------- start / finish


def start_worker(rank, world_size, resources, control, timeout, mode) -> World:
    """Make this process rank ``rank``; its transport connects at its first use."""
    global _world
    from minidist.distributed.transport import default_spin_ns

    def connect():
        # The transport's own shortcuts (spinning, rendezvous, ...) go with the
        # fast paths' switch as it stands when the transport connects.
        from minidist.distributed import fast_paths

        return resources.connect(rank, control, timeout, default_spin_ns(world_size),
                                 fast=fast_paths.enabled())

    _world = World(rank, world_size, control, resources, mode, connect)
    control.set_state(rank, ctl.RUNNING, _trace.now())
    membership.join(rank, world_size)  # what DistributedSampler() reads (data is below us)
    return _world


def finish_worker() -> None:
    """Complete outstanding sends, tell the others this rank is done, disconnect."""
    global _world
    world = _world
    if world is None:
        return
    try:
        if not world.failed:
            calls, last_tags = {}, {}
            if world.connected:
                transport = world.transport
                transport.flush()
                # A message of a collective call that no receive asked for,
                # tagged for another fingerprint: ranks disagreed (on a root,
                # say) yet each completed. Say so rather than return wrong data.
                transport.check_collectives_ended()
                calls = {context: record.seq
                         for context, record in transport.collective_groups.items()}
                last_tags = {context: record.last_tag()
                             for context, record in transport.collective_groups.items()}
            # How many collective calls this rank made in each group, written
            # before FINISHED: a peer still waiting in a later call reads it and
            # knows at once that this rank will never join (check_group).
            world.control.record_calls(world.rank, calls, last_tags)
            world.control.set_state(world.rank, ctl.FINISHED, _trace.now())
    finally:
        world.close_transport()
        _world = None
        membership.leave()


def mark_failed() -> None:
    if _world is not None:
        _world.failed = True
        _world.control.set_state(_world.rank, ctl.FAILED, _trace.now())


# --------------------------------------------------------------------------- public API


def init_process_group(backend: str | None = None, init_method=None, timeout=None,
                       world_size: int = -1, rank: int = -1, *, transport: str | None = None,
                       log_level="INFO") -> None:
    """Join the run this process was started in (torch.distributed's signature).

    Under ``minidist run`` everything comes from the environment; under
    :func:`minidist.launch` the process is already initialized and this
    returns at once; under ``mpiexec`` (MPICH or Open MPI) it joins the MPI
    job over the "mpi" transport (needs ``pip install -e '.[mpi]'``). ``backend`` may be a minidist transport ("shm", "pipe") or
    a torch backend name ("gloo", ...), which means "whatever the launcher chose".
    """
    transport = transport or (backend if backend not in _TORCH_BACKENDS else None)
    if _world is not None:
        _check_consistent(_world, transport, world_size, rank)
        return
    if init_method not in (None, "env://"):
        raise ValueError(f"init_method {init_method!r} is not supported; minidist's launchers "
                         "pass everything through the environment (env://)")
    from minidist.distributed.transport.mpi_environment import launched_by_mpi

    if "MINIDIST_RANK" in os.environ:
        _init_from_environment(transport, world_size, rank, timeout, log_level)
    elif launched_by_mpi():
        _init_from_mpi(transport, world_size, rank, timeout, log_level)
    elif _torchrun_world() is not None:
        _init_from_torchrun(world_size, rank, timeout)
    elif transport == "mpi":
        raise RuntimeError(
            "init_process_group(transport='mpi'): this process was not started by mpiexec "
            "(no PMI_RANK or OMPI_COMM_WORLD_RANK in its environment). Start the script "
            "with `mpiexec -n 4 python script.py`.")
    elif world_size in (-1, 1, None) and rank in (-1, 0, None):
        if world_size in (-1, None):
            raise RuntimeError(
                "init_process_group() found no MINIDIST_RANK in the environment: this process "
                "was not started by a minidist launcher. Start the script with "
                "`minidist run -n 4 script.py`, run a function with minidist.launch(fn, "
                "world_size=4), or call init_process_group(world_size=1) to run alone.")
        _init_single(timeout)
    else:
        raise RuntimeError(
            f"init_process_group(world_size={world_size}) cannot start other processes by "
            f"itself; use `minidist run -n {world_size} script.py` or minidist.launch(fn, "
            f"world_size={world_size}).")


def _check_consistent(world: World, transport, world_size, rank) -> None:
    if world_size not in (-1, None) and world_size != world.world_size:
        raise ValueError(f"init_process_group(world_size={world_size}), but this run has "
                         f"{world.world_size} ranks")
    if rank not in (-1, None) and rank != world.rank:
        raise ValueError(f"init_process_group(rank={rank}), but this process is rank "
                         f"{world.rank}")
    if transport is not None and transport != world.transport.name:
        raise ValueError(f"init_process_group asks for transport {transport!r}, but this run "
                         f"uses {world.transport.name!r}")


def _init_single(timeout) -> None:
    from minidist.distributed.transport.pipe import PipeResources

    control = ctl.ControlBlock.local(1)
    start_worker(0, 1, PipeResources(1, {}), control, _seconds(timeout), "single")


def _torchrun_world() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) as torchrun sets them, or None when they are not both set."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"init_process_group(): RANK={os.environ['RANK']!r} and WORLD_SIZE="
                         f"{os.environ['WORLD_SIZE']!r} in the environment must be integers "
                         "(as torchrun sets them); unset them or fix them.") from None


def _init_from_torchrun(world_size, rank, timeout) -> None:
    """torchrun's RANK and WORLD_SIZE: a world of one runs alone; several cannot
    meet, since minidist has no TCP rendezvous (MASTER_ADDR / MASTER_PORT)."""
    env_rank, env_world = _torchrun_world()
    if world_size not in (-1, None) and world_size != env_world:
        raise ValueError(f"init_process_group(world_size={world_size}), but WORLD_SIZE is "
                         f"{env_world} in the environment")
    if rank not in (-1, None) and rank != env_rank:
        raise ValueError(f"init_process_group(rank={rank}), but RANK is {env_rank} in the "
                         "environment")
    if env_world == 1 and env_rank == 0:
        _init_single(timeout)
        return
    where = ""
    if "MASTER_ADDR" in os.environ:
        where = f" at {os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '?')}"
    raise RuntimeError(
        f"init_process_group() found torchrun's RANK={env_rank} and WORLD_SIZE={env_world}, "
        f"but minidist cannot rendezvous over TCP{where}: its ranks meet through shared "
        f"memory and pipes their launcher creates. Start the script with `minidist run "
        f"-n {env_world} script.py` (one machine) or `mpiexec -n {env_world} python "
        f"script.py` (MPI), not torchrun.")


def _init_from_environment(transport, world_size, rank, timeout, log_level) -> None:
    from minidist.distributed.transport import resources_from_spec
    from minidist.runtime import console
    from minidist.runtime.process_setup import prepare_worker_process

    env_rank = int(os.environ["MINIDIST_RANK"])
    env_world = int(os.environ["MINIDIST_WORLD_SIZE"])
    spec = _run_description()
    if world_size not in (-1, None) and world_size != env_world:
        raise ValueError(f"init_process_group(world_size={world_size}), but `minidist run` "
                         f"started {env_world} ranks")
    if rank not in (-1, None) and rank != env_rank:
        raise ValueError(f"init_process_group(rank={rank}), but MINIDIST_RANK is {env_rank}")
    if transport is not None and transport != spec["transport"]["transport"]:
        raise ValueError(f"init_process_group asks for transport {transport!r}, but "
                         f"`minidist run` chose {spec['transport']['transport']!r} "
                         "(use --transport)")
    prepare_worker_process(spec["parent_pid"])
    if spec.get("log_fd") is not None:
        console.configure_script_logging(spec["log_fd"], env_rank, log_level)
    if spec.get("trace_dir"):
        _trace.start_recording(env_rank)
    control = ctl.ControlBlock.attach(spec["control"])
    resources = resources_from_spec(spec["transport"])
    op_timeout = _seconds(timeout) if timeout is not None else spec.get("timeout")
    world = start_worker(env_rank, env_world, resources, control, op_timeout, "run")
    world.trace_dir = spec.get("trace_dir")
    error_dir = spec.get("error_dir")
    previous_hook = sys.excepthook

    def report_uncaught(kind, value, tb):
        mark_failed()
        text = "".join(traceback.format_exception(kind, value, tb))
        if error_dir:
            try:
                with open(os.path.join(error_dir, f"rank{env_rank}.txt"), "w") as file:
                    # The rank to follow: a mismatch's odd rank, or the peer a
                    # PeerGoneError waited for (as a launch's worker reports).
                    odd = getattr(value, "odd", ())
                    json.dump({"type": kind.__name__, "message": str(value), "traceback": text,
                               "peer": odd[0] if odd else getattr(value, "peer", None),
                               "at": time.monotonic()}, file)
                return  # the parent prints it, once, with the others' states
            except OSError:
                pass
        previous_hook(kind, value, tb)

    sys.excepthook = report_uncaught
    atexit.register(_finish_script)


def _run_description() -> dict:
    """What `minidist run` says about the run: on the pipe MINIDIST_RUN_FD, written
    once the run's shared memory exists (this process may get here first: it
    waits), or in MINIDIST_RUN."""
    if "MINIDIST_RUN_FD" not in os.environ:
        return json.loads(os.environ["MINIDIST_RUN"])
    fd = int(os.environ.pop("MINIDIST_RUN_FD"))
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    if not chunks:
        raise RuntimeError("`minidist run` stopped before this run was ready (the launching "
                           "process ended or failed to make the run's shared memory); see "
                           "its error")
    return json.loads(b"".join(chunks))


def _init_from_mpi(transport, world_size, rank, timeout, log_level="INFO") -> None:
    """Join the run mpiexec started, over the mpi transport. No minidist parent
    watches these ranks: the control block is shared by the ranks of this
    machine only (transport/mpi_node.py), and a rank that raises reports itself
    and ends the job with MPI_Abort (no hang).
    ``MINIDIST_TRACE_DIR`` set: each rank writes ``rank<r>.jsonl`` there at exit."""
    from minidist.distributed.transport.mpi import MpiResources, mpi_environment

    env_rank, env_world = mpi_environment()
    if transport not in (None, "mpi"):
        raise ValueError(f"init_process_group asks for transport {transport!r}, but this "
                         "process was started by mpiexec: only 'mpi' can connect it")
    if world_size not in (-1, None) and world_size != env_world:
        raise ValueError(f"init_process_group(world_size={world_size}), but mpiexec "
                         f"started {env_world} ranks")
    if rank not in (-1, None) and rank != env_rank:
        raise ValueError(f"init_process_group(rank={rank}), but mpiexec made this process "
                         f"rank {env_rank}")
    resources = MpiResources.from_environment()
    # No parent gathers these ranks' records (as `minidist run` does): each
    # prints its own, with its rank.
    from minidist.runtime import console

    console.configure_mpi_logging(resources.rank, log_level)
    trace_dir = os.environ.get("MINIDIST_TRACE_DIR")
    if trace_dir:
        _trace.start_recording(resources.rank)
    # Shared with the ranks on this machine (the others' records are not
    # visible: see transport/mpi_node.py), so that a waiting rank sees a peer
    # that finished early, vanished or froze.
    control = resources.control_block()
    op_timeout = _seconds(timeout) if timeout is not None else DEFAULT_TIMEOUT
    world = start_worker(resources.rank, resources.world_size, resources, control, op_timeout,
                         "mpi")
    world.trace_dir = trace_dir
    previous_hook = sys.excepthook

    def abort_job(kind, value, tb):
        if _world is None:
            previous_hook(kind, value, tb)
            return
        mark_failed()
        report_failure_and_abort(resources.abort, world.rank, world.world_size, value)

    sys.excepthook = abort_job
    atexit.register(_finish_script)


def report_failure_and_abort(abort, rank: int, size: int, error: BaseException) -> None:
    """Under mpiexec: say which rank failed and why, then end every rank of the
    job with ``abort`` (MPI_Abort). No minidist parent watches MPI ranks, so
    this line is the report; its first line names the rank that caused the
    failure (see :func:`_headline`)."""
    from minidist.distributed.transport.mpi import release_segments, tell_launcher

    headline = _headline(rank, size, error)
    tell_launcher("failed", headline)  # this rank reports itself; the launcher repeats the headline
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stderr.write(f"minidist: {headline}\n{text}"
                     "minidist: ending the job (MPI_Abort)\n")
    sys.stderr.flush()
    sys.stdout.flush()
    # mpiexec forwards each rank's output through its process manager, and
    # MPI_Abort tears that down at once: on a loaded machine the lines just
    # written were lost (CI saw an empty output). Give the forwarder a moment.
    time.sleep(0.5)
    release_segments()  # MPI_Abort kills the job's ranks outright: none would unlink them
    abort(1)


def _headline(rank: int, size: int, error: BaseException) -> str:
    """The first line of an MPI rank's failure report: the rank that caused it
    first, as the launchers of pipe and shm say it. The error names its
    culprit (a peer that vanished or froze: ``error.culprit``, set by the mpi
    transport), or the odd rank of a CollectiveMismatchError (its first line,
    the group's verdict), or it is a PeerGoneError of a peer that returned
    while this rank still needed it; otherwise the cause is this rank."""
    from minidist.runtime.errors import PeerGoneError

    first = str(error).split("\n", 1)[0]
    culprit = getattr(error, "culprit", None)
    if culprit is not None and culprit != rank:
        return f"{first} (seen by rank {rank} of {size})"
    odd = getattr(error, "odd", ())
    if odd:
        # The group's verdict names the odd rank, whichever rank noticed.
        return f"{first} (seen by rank {rank} of {size})"
    if isinstance(error, PeerGoneError) and error.peer not in (None, rank):
        return (f"rank {error.peer} returned from its function (or ended its script) while "
                f"rank {rank} of {size} still waited for it. {first}")
    return f"rank {rank} of {size} failed with {type(error).__name__}: {error}"


def _finish_script() -> None:
    world = _world
    if world is None or world.mode not in ("run", "mpi"):
        return
    trace_dir = world.trace_dir
    try:
        finish_worker()
        if world.mode == "mpi":
            # MPI_Finalize, next, waits for every rank of the job: a peer of
            # this machine stopped after its last message would hold it there
            # for good. Watched until it ends its script too (mpi_node.py).
            from minidist.distributed.transport.mpi_node import await_peers

            await_peers(world.rank, world.control, world.resources.node_ranks)
    except BaseException as error:
        mark_failed()
        if world.mode == "mpi":
            # At exit an error is only printed, and the process would end with
            # status 0: under mpiexec, report it and end the job instead.
            report_failure_and_abort(world.resources.abort, world.rank, world.world_size,
                                     error)
        raise
    finally:
        if trace_dir:
            events = _trace.stop_recording()
            path = os.path.join(trace_dir, f"rank{world.rank}.jsonl")
            _trace.write_jsonl(path, events, _trace.make_header(world.world_size))


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the run (world) or forget a subgroup. Outstanding sends complete first."""
    if group is not None and _world is not None and group is not _world.group:
        return  # subgroups own nothing beyond their number
    world = current()
    if world.mode == "run":
        _finish_script()
    else:
        finish_worker()  # under launch, the function may go on without the runtime


def group_or_world(group: ProcessGroup | None) -> ProcessGroup:
    if group is None:
        return current().group
    from minidist.distributed.process_group import ProcessGroup

    if not isinstance(group, ProcessGroup):
        if type(group).__name__ == "DeviceMesh":  # device_mesh.py imports this module
            name = (group.mesh_dim_names or (0,))[0]
            raise TypeError(
                f"group must be a ProcessGroup, got the {group!r}: as in torch, a mesh is not "
                f"a group; pass one of its groups, mesh.get_group({name!r}) (of a 1-D mesh, "
                "mesh.get_group()). The strategies' group= take a 1-D mesh too.")
        raise TypeError(f"group must be a ProcessGroup (from dist.new_group), got "
                        f"{type(group).__name__}")
    return group


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the world by default); -1 if not a member."""
    if group is None:
        return current().rank  # the world's, known without connecting the transport
    return group_or_world(group).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (the world by default); -1 if this
    process is not a member, as torch returns."""
    if group is None:
        return current().world_size
    group = group_or_world(group)
    return group.size if group.rank >= 0 else -1


def get_backend(group: ProcessGroup | None = None) -> str:
    """The name of the transport ``group``'s messages travel on ("shm", "pipe",
    "mpi"): torch's backend ("gloo", "nccl") is minidist's transport."""
    return group_or_world(group).transport.name


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank among the ranks on its machine (torch 2.x's name).

    ``LOCAL_RANK`` when a launcher set it (``minidist run`` does, as torchrun
    does), else what mpiexec says (Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``,
    MPICH's ``MPI_LOCALRANKID``), else the rank under :func:`minidist.launch`
    (every rank is on this machine), else ``fallback_rank``.
    """
    for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"):
        if name in os.environ:
            return int(os.environ[name])
    if _world is not None and _world.mode in ("launch", "run", "single"):
        return _world.rank
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("get_node_local_rank(): no LOCAL_RANK in the environment and no "
                       "minidist run started here; call init_process_group() first, start "
                       "the script with `minidist run`, or pass fallback_rank=.")


def failed_ranks() -> frozenset:
    """World ranks that have failed (raised or died) so far. Only a run started
    with ``launch(..., tolerate_failures=...)`` goes on after a failure, so
    this is how a fault-tolerant strategy learns who is gone without waiting."""
    world = current()
    return frozenset(rank for rank in range(world.world_size)
                     if world.control.state_of(rank) == ctl.FAILED)


def finished_ranks() -> frozenset:
    """World ranks that have returned from their function so far (left the run
    with success). A fault-tolerant strategy reads it with
    :func:`failed_ranks`: a peer that is gone without failing has finished,
    and what it agreed before leaving still holds."""
    world = current()
    return frozenset(rank for rank in range(world.world_size)
                     if world.control.state_of(rank) == ctl.FINISHED)


#: Group ids of ``new_group(..., use_local_synchronization=True)`` lie above
#: this, apart from the counted ids of the groups every rank creates.
LOCAL_GROUP_IDS = 1 << 30


def new_group(ranks=None, timeout=None, backend=None, *, use_local_synchronization=False,
              group_desc=None) -> ProcessGroup:
    """A group of the given global ranks (sorted, as in torch); all ranks must call
    it, in the same order. Members' group ranks follow the sorted order.

    ``use_local_synchronization=True`` (torch's keyword): only the members
    call it, in any order with respect to other groups. The group's context
    is then computed from its members and ``group_desc`` instead of taken
    from the count of groups this process made, so every member gets the
    same one without the others' help; making the same group twice gives the
    same context (its messages are the same group's). A fault-tolerant
    strategy needs this: after a failure the survivors make a group of
    themselves, and no rank outside it takes part."""
    world = current()
    members = list(range(world.world_size)) if ranks is None else [int(r) for r in ranks]
    if len(set(members)) != len(members):
        raise ValueError(f"new_group ranks {members} contain duplicates")
    for member in members:
        if not 0 <= member < world.world_size:
            raise ValueError(f"new_group: rank {member} is out of range 0..{world.world_size - 1}")
    if not members:
        raise ValueError("new_group needs at least one rank")
    from minidist.distributed.process_group import ProcessGroup

    if use_local_synchronization:
        import zlib

        name = f"{group_desc or ''}:{','.join(map(str, sorted(members)))}"
        group_id = LOCAL_GROUP_IDS | (zlib.crc32(name.encode()) % LOCAL_GROUP_IDS)
        return ProcessGroup(world.transport, sorted(members), group_id)
    world.groups_created += 1
    return ProcessGroup(world.transport, sorted(members), world.groups_created)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    return group.global_rank(group_rank)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    return group.group_rank(global_rank)
