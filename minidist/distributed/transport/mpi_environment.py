"""Was this process started by mpiexec, and as which rank? The environment says.

Apart from :mod:`.mpi` (which imports NumPy, and mpi4py when connecting):
``init_process_group`` asks this of every process it starts in, and a rank of
``minidist run`` should not import the MPI transport to learn that it is not
an MPI rank.
"""

from __future__ import annotations

import os

#: (rank variable, size variable) as MPICH's hydra, Open MPI and PMIx set them.
_RANK_VARIABLES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                   ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))


_RANK_VARIABLES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                   ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))


def mpi_environment(environ=None) -> tuple[int, int] | None:
    """(rank, world size) as mpiexec set them, or None. Reads the environment
    only: nothing is imported."""
    environ = os.environ if environ is None else environ
    for rank, size in _RANK_VARIABLES:
        if rank in environ and size in environ:
            return int(environ[rank]), int(environ[size])
    return None


def launched_by_mpi(environ=None) -> bool:
    """Was this process started by mpiexec (MPICH's hydra or Open MPI)?"""
    return mpi_environment(environ) is not None
