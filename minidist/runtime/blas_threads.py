"""Keep N workers from each starting a BLAS thread per core.

NumPy's matrix products run on a BLAS library (OpenBLAS in NumPy's wheels)
with a pool of one thread per core. Four workers on a 2-core laptop would
then run 8 BLAS threads fighting for 2 cores, and everything slows down.
Each worker should use ``cores // workers`` threads (at least one).

* Workers that are separate programs (``minidist run``) get the usual
  environment variables (OMP/OPENBLAS/MKL/... ``_NUM_THREADS``) before they
  start, unless the user set them.
* Workers made by fork inherit a BLAS library that is already loaded and
  configured; environment variables are read only at load time, so instead we
  call the library's own ``*_set_num_threads`` through ctypes (the same thing
  threadpoolctl does, for the libraries NumPy ships). The launcher calls it in
  the *parent*, around the forks (:func:`for_forked_workers`): each worker is
  born with the right count and the parent gets its own back. Calling it in
  each worker instead made OpenBLAS, whose pool fork had emptied, first start
  the parent's number of threads again in every worker (a thread that spins
  for a while, stealing a core from the ranks), and read ``/proc/self/maps``
  once per worker.

:func:`openblas_cores` names the CPU kernels a loaded OpenBLAS runs: the
convolutions size their matrix products for the SkylakeX family's
small-matrix kernel (:mod:`minidist.nn.im2col`).

:func:`limit` fixes the count inside one process for a while, for code
whose results must not depend on it (one matrix product can round
differently on 1 and on 2 threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

# (library file name contains, setter symbols, getter symbols)
_LIBRARIES = (
    ("openblas", ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
                  "scipy_openblas_set_num_threads_64_", "openblas_set_num_threads64_"),
     ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
      "scipy_openblas_get_num_threads_64_", "openblas_get_num_threads64_")),
    ("mkl_rt", ("MKL_Set_Num_Threads",), ("MKL_Get_Max_Threads",)),
    ("libgomp", ("omp_set_num_threads",), ("omp_get_max_threads",)),
    ("libomp", ("omp_set_num_threads",), ("omp_get_max_threads",)),
)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_worker(world_size: int) -> int:
    return max(1, available_cores() // max(world_size, 1))


def environment_for(world_size: int, environ=None) -> dict[str, str]:
    """Thread-count variables for a worker program, leaving the user's own alone."""
    environ = os.environ if environ is None else environ
    count = str(threads_per_worker(world_size))
    return {name: count for name in _ENV_VARS if name not in environ}


def _loaded_libraries():
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line and "/" in line}
    except OSError:
        return
    for path in sorted(paths):
        name = os.path.basename(path)
        for marker, setters, getters in _LIBRARIES:
            if marker in name:
                try:
                    library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                except OSError:
                    continue
                yield path, library, setters, getters


def _first_symbol(library, names):
    for name in names:
        function = getattr(library, name, None)
        if function is not None:
            return function
    return None


def set_blas_threads(count: int) -> dict[str, int]:
    """Set the thread count of every BLAS/OpenMP library already loaded here.
    Returns {library path: count} for those it could set."""
    done = {}
    for path, library, setters, _ in _loaded_libraries():
        setter = _first_symbol(library, setters)
        if setter is not None:
            setter.argtypes = [ctypes.c_int]
            setter(count)
            done[path] = count
    return done


def blas_threads() -> dict[str, int]:
    """{library path: thread count} of the loaded BLAS/OpenMP libraries."""
    counts = {}
    for path, library, _, getters in _loaded_libraries():
        getter = _first_symbol(library, getters)
        if getter is not None:
            getter.restype = ctypes.c_int
            counts[path] = getter()
    return counts


#: Names of OpenBLAS's "which CPU kernels am I running" function, as NumPy's
#: and SciPy's bundled builds (suffixed 64-bit interfaces) and plain builds spell it.
_CORENAME_SYMBOLS = ("openblas_get_corename", "scipy_openblas_get_corename64_",
                     "scipy_openblas_get_corename_64_", "openblas_get_corename64_")


def openblas_cores() -> list[str]:
    """The CPU kernel set of each OpenBLAS loaded in this process, as OpenBLAS
    names it ("SkylakeX", "Haswell", "Zen", ...): it picks one at load time
    (or ``OPENBLAS_CORETYPE`` picks it). Empty when no OpenBLAS is loaded or
    it cannot say (another BLAS, not Linux). Cost: one read of
    ``/proc/self/maps``; call it once."""
    cores = []
    for _, library, _, _ in _loaded_libraries():
        corename = _first_symbol(library, _CORENAME_SYMBOLS)
        if corename is not None:
            corename.restype = ctypes.c_char_p
            name = corename()
            if name:
                cores.append(name.decode("ascii", "replace").strip())
    return cores


_found: tuple = (None, [])  # (len(sys.modules) when looked up, what was found)


class _OpenBlasCount:
    """OpenBLAS's thread count as the variable it lives in (``blas_cpu_number``,
    an exported ``int``: what ``openblas_get_num_threads`` returns and what its
    next call splits work by). Writing it changes the count without what
    ``openblas_set_num_threads`` also does first: restart the thread pool that
    fork stopped (a thread made, then stopped again at the next fork).

    The count written is at most the pool's size (``blas_num_threads``: the
    threads OpenBLAS allocated at load time, one per core, or
    ``OPENBLAS_NUM_THREADS`` when the user set it). A larger count sends work
    to threads that do not exist, and the product waits for them for ever
    (a worker hung that way under ``OPENBLAS_NUM_THREADS=1``)."""

    def __init__(self, variable, pool=None):
        self.variable = variable
        self.pool = pool

    def __call__(self, count: int | None = None) -> int | None:
        if count is None:
            return self.variable.value
        if self.pool is not None and self.pool.value >= 1:
            count = min(count, self.pool.value)
        self.variable.value = count
        return None


def _count_variable(library, getter):
    """OpenBLAS's count variable when it is exported and holds what its getter
    says (so it is the one the library reads), else None."""
    if getattr(library, "blas_thread_shutdown_", None) is None:
        return None  # not OpenBLAS built with its own thread pool
    try:
        variable = ctypes.c_int.in_dll(library, "blas_cpu_number")
    except ValueError:
        return None
    try:
        pool = ctypes.c_int.in_dll(library, "blas_num_threads")
    except ValueError:
        return None  # the pool's size unknown: writing the count would not be safe
    return _OpenBlasCount(variable, pool) if variable.value == getter() else None


def _thread_apis() -> list:
    """[(library, setter, getter)] of the loaded libraries that have both (for
    OpenBLAS both are its count variable, see :class:`_OpenBlasCount`). Looked
    up again only when a module was imported since the last time (a new BLAS
    library comes with the extension module that loads it), so a program that
    launches often reads ``/proc/self/maps`` once, not at every launch."""
    global _found
    if _found[0] != len(sys.modules):
        apis = []
        for _, library, setters, getters in _loaded_libraries():
            setter, getter = _first_symbol(library, setters), _first_symbol(library, getters)
            if setter is not None and getter is not None:
                setter.argtypes = [ctypes.c_int]
                getter.restype = ctypes.c_int
                variable = _count_variable(library, getter)
                if variable is not None:
                    setter = getter = variable
                apis.append((library, setter, getter))
        _found = (len(sys.modules), apis)
    return _found[1]


@contextlib.contextmanager
def for_forked_workers(count: int):
    """In the launching process, while it forks workers: every loaded BLAS/OpenMP
    library set to ``count`` threads (what each worker inherits), the parent's
    own counts put back afterwards. Libraries whose count cannot be read are
    left alone. Cost: a few calls per library (and, after new imports, one
    read of ``/proc/self/maps``), instead of that read in every worker.

    OpenBLAS stops its thread pool before every fork (its at-fork handler) and
    starts it again at the next call that wants threads; but
    ``openblas_set_num_threads`` starts it at once, and a new pool thread
    spins for a while before it sleeps, on the cores the new workers need.
    So OpenBLAS's count is written in its variable instead
    (:class:`_OpenBlasCount`): no thread starts, the parent ends as fork
    leaves it, and pays for the pool only if it uses BLAS again. Where only
    the setter exists, the pool it started is stopped again with the handler
    fork itself calls."""
    changed = []
    try:
        _set_counts(count, changed)
        yield
    finally:
        for library, setter, previous in changed:
            setter(previous)
            stop_pool = getattr(library, "blas_thread_shutdown_", None)  # OpenBLAS only
            if stop_pool is not None and not isinstance(setter, _OpenBlasCount):
                stop_pool()


def _set_counts(count: int, changed: list) -> None:
    """Every loaded library whose count can be read set to ``count``;
    ``(library, setter, previous count)`` appended to ``changed`` for each
    one changed (appended as it goes, so a failure part way is undone)."""
    for library, setter, getter in _thread_apis():
        previous = getter()
        if previous != count:
            setter(count)
            changed.append((library, setter, previous))


@contextlib.contextmanager
def limit(count: int):
    """In this process, while inside: every loaded BLAS/OpenMP library runs
    ``count`` threads; its own counts are put back afterwards (libraries
    whose count cannot be read are left alone). Cost: as
    :func:`for_forked_workers`, a few calls per library.

    Why a caller fixes the count: OpenBLAS splits one matrix product among
    its threads by blocks of rows and columns, and on some of its kernel sets
    (Haswell, which many laptops run) an output's last bits depend on where
    it falls in its block. The same product on 1 and on 2 threads then
    differs by a rounding: code that promises the same bits in one process
    as on N must compute with the same count in both
    (:mod:`minidist.parallel.data.inference` uses one)."""
    changed = []
    try:
        _set_counts(count, changed)
        yield
    finally:
        for _, setter, previous in changed:
            setter(previous)
