"""torch.distributed's names for the world, its groups and its backends, as a
ported script uses them, answered in minidist's terms.

    import minidist.distributed as dist

    dist.is_available()                           # True
    dist.all_reduce(x, group=dist.group.WORLD)    # the default group: the world
    dist.get_process_group_ranks(tp_group)        # [2, 3]: global ranks, group order
    node_group, all_node_groups = dist.new_subgroups()
    dist.init_process_group(backend=dist.Backend.GLOO)

Where minidist must answer differently from torch, the docstring says so:

* ``group.WORLD`` / ``GroupMember.WORLD`` is, as in torch, the default
  group once the process is initialized and None before; ``None`` as a
  ``group=`` means the world in every call, so both forms work anywhere.
* ``GroupMember.NON_GROUP_MEMBER``: torch's ``new_group`` returns this
  sentinel to the ranks outside the group; minidist's returns a
  :class:`~.process_group.ProcessGroup` whose ``rank`` is -1 (its members'
  list is then known everywhere). So that the test torch scripts write,
  ``group != GroupMember.NON_GROUP_MEMBER``, keeps its meaning, the
  sentinel compares equal to every group this rank is not a member of (an
  ``is`` test cannot be made to).
* :class:`Backend` names torch's backends ("gloo", "nccl", "mpi", "ucc") and
  minidist's transports ("pipe", "shm", "mpi"). minidist has one way to move
  bytes per run, chosen by its launcher, so a torch backend name means "the
  transport this run was started with", which is how
  ``init_process_group(backend="gloo")`` has always read it.
* :func:`is_torchelastic_launched` is torch's test, ``TORCHELASTIC_RUN_ID``
  in the environment. ``minidist run`` sets torchrun's ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, and only with
  ``--max-restarts`` the ``TORCHELASTIC_*`` names as well (restart count,
  max restarts, run id: it is then torchrun's elastic agent on one machine,
  :mod:`minidist.run_elastic`). So it is True under ``minidist run
  --max-restarts`` and False under a plain ``minidist run``, and a script
  that believes it reads ``TORCHELASTIC_*`` variables that are there.
"""

from __future__ import annotations

import os

from minidist.distributed import world


def is_available() -> bool:
    """Whether the distributed package can be used: always, here (torch's name)."""
    return True


def is_torchelastic_launched() -> bool:
    """Whether torchrun's elastic agent started this process (``TORCHELASTIC_RUN_ID``
    is set), as torch decides it: under ``minidist run`` only with
    ``--max-restarts`` (its elastic attempts set torchrun's names)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


class _WorldAttribute(type):
    """Gives a class torch's ``WORLD`` attribute: read on every use, since the
    world group exists only once the process is initialized."""

    @property
    def WORLD(cls):  # noqa: N802 - torch's name
        return world.current().group if world.is_initialized() else None


class _NonGroupMember:
    """The sentinel torch's ``new_group`` returns to non-members; equal to
    every ProcessGroup this rank is not a member of."""

    def __eq__(self, other) -> bool:
        return other is self or getattr(other, "is_member", None) is False

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class group(metaclass=_WorldAttribute):  # noqa: N801 - torch's name
    """``dist.group.WORLD``: the default group (None before initialization)."""


class GroupMember(metaclass=_WorldAttribute):
    """``GroupMember.WORLD`` (the default group) and ``GroupMember.NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = _NonGroupMember()


class Backend(str):
    """A backend's name, a string (torch's class): ``Backend.GLOO == "gloo"``.

    ``Backend(name)`` takes torch's names and minidist's transports, in any
    case, and refuses the others (minidist cannot load a backend plug-in).
    A torch name stands for the transport the run was started with (see the
    module docstring); a transport's name for itself."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    PIPE = "pipe"
    SHM = "shm"

    #: What each name is in minidist: a transport, or "the launcher's choice".
    MEANING = {"gloo": "the run's transport", "nccl": "the run's transport",
               "ucc": "the run's transport", "mpi": "the mpi transport (under mpiexec)",
               "pipe": "the pipe transport", "shm": "the shm transport"}

    def __new__(cls, name):
        if not isinstance(name, str):
            raise ValueError(f"Backend needs a name (a string), got {type(name).__name__}")
        lowered = name.lower()
        if lowered not in cls.MEANING:
            raise ValueError(
                f"Backend({name!r}): minidist knows torch's backends 'gloo', 'nccl', 'ucc', "
                f"'mpi' (each meaning the transport the run was started with) and its own "
                f"transports 'pipe', 'shm', 'mpi'; it cannot load another.")
        return super().__new__(cls, lowered)


def get_process_group_ranks(group=None) -> list[int]:
    """The global ranks of ``group`` (None: the world), in the group's rank order."""
    return list(world.group_or_world(group).ranks)


def _ranks_per_machine() -> int:
    """How many ranks run on this machine: torch's default subgroup is one per
    machine (its device count, one rank per device)."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if name in os.environ:
            return int(os.environ[name])
    current = world.current()
    if current.mode in ("launch", "run", "single"):
        return current.world_size  # every rank of these runs is on this machine
    raise ValueError("new_subgroups(): the number of ranks per machine is unknown (no "
                     "LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS in the "
                     "environment); pass group_size=.")


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None):
    """One group per list of global ranks; returns (this rank's subgroup or
    None, all of them). Every rank calls it, as :func:`~.world.new_group`
    (torch's function)."""
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: the arg 'ranks_per_subgroup_list' "
                         "cannot be empty")
    seen = {}
    for ranks in ranks_per_subgroup_list:
        for rank in ranks:
            if rank in seen:
                raise ValueError(f"new_subgroups_by_enumeration: rank {rank} has appeared in "
                                 f"both subgroup {list(seen[rank])} and {list(ranks)}")
            seen[rank] = ranks
    me = world.get_rank()
    mine, subgroups = None, []
    for ranks in ranks_per_subgroup_list:
        subgroup = world.new_group(ranks, timeout=timeout, backend=backend)
        subgroups.append(subgroup)
        if me in subgroup.ranks:
            mine = subgroup
    return mine, subgroups


def new_subgroups(group_size: int | None = None, group=None, timeout=None, backend=None):
    """Cut ``group`` (None: the world) into consecutive subgroups of
    ``group_size`` ranks; returns (this rank's subgroup, all of them), as torch.

    ``group_size`` defaults to the ranks on this machine (``LOCAL_WORLD_SIZE``,
    or what mpiexec says, or every rank under ``minidist run`` and
    :func:`minidist.launch`, whose ranks share one machine): torch's default,
    the machine's device count, means the same with one rank per device. Every
    rank of the world calls it (the subgroups are made with ``new_group``);
    the group's size must be a multiple of ``group_size`` (ValueError, as torch)."""
    if group_size is None:
        group_size = _ranks_per_machine()
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"new_subgroups: the arg 'group_size' ({group_size}) must be a "
                         "positive int")
    parent = world.group_or_world(group)
    size = parent.size
    if size < group_size:
        raise ValueError(f"new_subgroups: the arg 'group_size' ({group_size}) must not exceed "
                         f"the world size ({size})")
    if size % group_size:
        raise ValueError(f"new_subgroups: the world size ({size}) must be divisible by "
                         f"group_size={group_size}")
    ranks = list(parent.ranks)
    mine, subgroups = new_subgroups_by_enumeration(
        [ranks[start:start + group_size] for start in range(0, size, group_size)],
        timeout=timeout, backend=backend)
    if mine is None:
        raise ValueError(f"new_subgroups: rank {world.get_rank()} is not in the group it cut "
                         f"into subgroups (ranks {ranks}); it had to call new_subgroups (every "
                         "rank makes every group, in the same order), but only the group's "
                         "members get a subgroup.")
    return mine, subgroups
