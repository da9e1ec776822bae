"""The process runtime: everything about processes, below the transports.

Nothing here knows what a message, a collective or a process group is, and
nothing here imports from above (a test holds it to that: tests/test_layers.py).

* :mod:`.errors`        the errors every layer raises, each saying what to do;
* :mod:`.segments`      named shared-memory segments that never outlive their run;
* :mod:`.control`       the control block: abort flag, per-rank status records,
                        per-rank collective call counts;
* :mod:`.desync`        the report of what every rank was doing when one timed out;
* :mod:`.supervisor`    the parent's watchdog: wait for the workers, stop them all
                        on the first failure, name the root cause;
* :mod:`.workers`       the two kinds of worker it watches (forked, separate program);
* :mod:`.oversubscription` more ranks than cores: said once per program;
* :mod:`.signals`       SIGTERM and Ctrl-C as clean exits, never mid-step;
* :mod:`.process_setup` a worker's first steps: die with the parent, signals;
* :mod:`.blas_threads`  one BLAS thread pool size per worker, so ranks share cores;
* :mod:`.allocator`     keep freed memory, so each training step does not page it in again;
* :mod:`.machine_memory` the memory this machine can give, and the share one run may take;
* :mod:`.console`       workers' logs routed to the parent, rank-0 printing.

``minidist.launch`` (in :mod:`minidist.distributed.launch`) joins these to the
transports and the world: it sits above both.
"""
