"""Where a command's tasks run: this process, a process pool, or a dask.distributed cluster.

The claims hand their independent pieces to propositions.kit.parallel (`map_tasks`; `map_chunks`,
through kit.protocol.map_evidence; `start`), which runs them on the executor installed in its slot
and knows nothing else. This module makes those executors and installs one where a command starts
(`using`, from certify/cli.py):

* `Inline()` (propositions.kit.parallel): tasks run one after another in this process.
* `Pool(workers)`: a ProcessPoolExecutor with the "spawn" start method (torch's and OpenBLAS's
  thread pools hang in a forked child), each worker limited to one BLAS thread as the command
  itself is (threadpoolctl), so that a worker rounds exactly as the command's process does.
* `Dask(address)`: a dask.distributed Client; the same tasks go to the cluster's workers, which are
  limited to one BLAS thread on connection. Its workers must round as this machine does (same
  libraries, same CPU kind): `Dask.check_preconditions` compares their rounding fingerprint with ours.

Tasks submitted from inside a task (a claim that runs as a task of `certify all`) run inline in that
worker with a process pool, and go back to the cluster with dask (`worker_client`). A worker that
dies takes the pool with it and is reported as one `TaskFailed` line, never as a hang.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.context
import os
import sys
from typing import Callable

from propositions.kit import parallel
from propositions.kit.parallel import Inline, Outcome, TaskFailed, one_line, run_task

__all__ = ["Inline", "Pool", "Dask", "TaskFailed", "using", "limit_blas_threads"]


def limit_blas_threads():
    """One thread for every BLAS library numpy and scipy load (both loaded first: threadpoolctl
    limits only the libraries already loaded), restored when the returned context exits. A thread
    count changes how BLAS splits a product, and so its rounding: a worker must run with the thread
    count of the process it stands in for; and on matrices of this size a BLAS thread pool buys
    nothing (on a busy machine its spinning threads made one (1024, 128) SVD fifty times slower)."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


@contextlib.contextmanager
def using(executor):
    """Run the map_tasks calls of the enclosed code on `executor` (closed on exit), with one BLAS
    thread here as in every worker, so that a task rounds the same wherever it runs."""
    try:
        with limit_blas_threads(), parallel.installed(executor):
            yield executor
    finally:
        executor.close()


# --------------------------------------------------------------------------------------------
# A pool of processes
# --------------------------------------------------------------------------------------------


def _end_without_teardown(loop_returned: list) -> None:
    if loop_returned:
        os._exit(0)


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A pool worker that ends without the interpreter's teardown once its work loop has returned.

    The loop returns after the pool's stop signal, every result delivered; multiprocessing then joins
    its queues' threads and flushes the standard streams, and the interpreter would free every module
    object by object: about 1.2 s per worker with torch, sympy and scipy loaded, all of it after the
    last certificate. The exit handler registered here, before any task ran, runs after the handlers
    the tasks registered (they run last first) and ends the process there. A worker whose loop raised
    exits the ordinary way, with its error code."""

    def run(self):
        loop_returned: list = []
        atexit.register(_end_without_teardown, loop_returned)
        super().run()
        loop_returned.append(True)


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


def _limit_worker_blas_threads() -> None:
    limit_blas_threads()  # for the life of the worker process


def _worker_start(progress_queue) -> None:
    """Initializer of a pool worker: one BLAS thread, nested tasks inline, progress to the queue."""
    _limit_worker_blas_threads()

    def progress(label: str, done: int, total: int) -> None:
        try:
            progress_queue.put_nowait((label, done, total))
        except Exception:  # progress is a courtesy; a full or closed queue never fails a certificate
            pass

    parallel.install_for_process(Inline(), progress)


def _warm_worker() -> None:
    import propositions

    propositions.discover()


def _results_by_index(executor, fn, calls, on_done, label: str) -> list[Outcome]:
    """executor.submit_each, the outcomes stored by task index: the merge order never depends on completion."""
    outcomes: list = [None] * len(calls)
    done = 0

    def store(index, outcome):
        nonlocal done
        outcomes[index] = outcome
        done += 1
        on_done(done)

    executor.submit_each(fn, calls, store, label)
    return outcomes


class Pool:
    """A pool of `workers` processes started with "spawn", one BLAS thread each."""

    scheduler = None

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self._context = _WorkerContext()
        self.progress_queue = self._context.Queue()
        self._pool = None

    def _executor(self):
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=self._context, initializer=_worker_start, initargs=(self.progress_queue,))
        return self._pool

    def warm(self) -> None:
        """Start every worker now, each importing the claim modules (propositions.discover), so that
        their start-up overlaps the parent's own before the first claim is submitted; nothing waits."""
        executor = self._executor()
        for _ in range(self.workers):
            executor.submit(_warm_worker)

    def _died(self, error: BaseException) -> TaskFailed:
        self._abandon()  # a fresh pool for the next tasks
        return TaskFailed(f"a worker process died while it ran a task ({one_line(error)})")

    def _collect(self, futures: dict, on_done: Callable[[int, Outcome], None]) -> None:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except BrokenProcessPool as error:
                    raise self._died(error) from None
                except Exception as error:  # a task or its result that cannot be pickled
                    raise TaskFailed(f"a task could not be sent to or back from a worker process ({one_line(error)})") from None
                on_done(futures[future], outcome)
        except BaseException:
            for future in futures:
                future.cancel()
            if not isinstance(sys.exc_info()[1], Exception):  # Ctrl-C: do not wait for the running tasks
                self._abandon()
            raise

    def _abandon(self) -> None:
        """Stop the pool's processes now (a dead worker broke it, or the command was interrupted)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)

    def submit_each(self, fn, calls, on_done, label: str = "") -> None:
        pool = self._executor()
        futures = {pool.submit(run_task, fn, args, kwargs, label): index for index, (args, kwargs) in enumerate(calls)}
        self._collect(futures, on_done)

    def start(self, fn, args: tuple, kwargs: dict, label: str = "") -> Callable[[], Outcome]:
        future = self._executor().submit(run_task, fn, args, kwargs, label)

        def outcome() -> Outcome:
            from concurrent.futures.process import BrokenProcessPool

            try:
                return future.result()
            except BrokenProcessPool as error:
                raise self._died(error) from None
            except Exception as error:
                raise TaskFailed(f"a task could not be sent to or back from a worker process ({one_line(error)})") from None

        return outcome

    def run(self, fn, calls, on_done, label: str = "") -> list[Outcome]:
        return _results_by_index(self, fn, calls, on_done, label)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# --------------------------------------------------------------------------------------------
# A dask.distributed cluster
# --------------------------------------------------------------------------------------------


def _run_on_dask_worker(fn, args: tuple, kwargs: dict, label: str = "") -> Outcome:
    """run_task on a dask worker: the task's own map_tasks calls go back to the cluster."""
    with parallel.installed(_DaskNested()):
        return run_task(fn, args, kwargs, label)


def _fingerprint_sha256() -> str:
    from certify import environment

    return environment.rounding_fingerprint()["sha256"]


class Dask:
    """The tasks go to a dask.distributed cluster (scheduler address, or a Client)."""

    def __init__(self, address):
        try:
            from distributed import Client
        except ImportError:
            raise ImportError("--scheduler needs dask.distributed, which is not installed (the 'distributed' extra: pip install -e '.[distributed]' in this project's checkout)") from None
        self.client = address if isinstance(address, Client) else Client(address)
        self._owns_client = not isinstance(address, Client)
        self.scheduler = self.client.scheduler.address
        self.client.run(_limit_worker_blas_threads)
        self.workers = len(self.client.scheduler_info(n_workers=-1)["workers"])

    def check_preconditions(self) -> list[str]:
        """Why this cluster cannot give the certificates this machine gives, one line each ([]: it can).

        Every worker must run one task at a time (warnings are recorded per process, and a task's
        BLAS limit is process-wide) and must round as this process does: the same rounding
        fingerprint (certify.environment), or its residuals would not be this machine's.
        """
        from certify import environment

        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            return ["the cluster has no workers"]
        problems = [f"worker {address} runs {info.get('nthreads')} threads; start workers with --nthreads 1"
                    for address, info in sorted(workers.items()) if info.get("nthreads") != 1]
        here = environment.rounding_fingerprint()["sha256"]
        theirs = self.client.run(_fingerprint_sha256)
        problems += [f"worker {address} rounds differently (rounding fingerprint {sha[:12]}, here {here[:12]})"
                     for address, sha in sorted(theirs.items()) if sha != here]
        return problems

    def _lost(self, error: BaseException) -> TaskFailed:
        return TaskFailed(f"the dask cluster at {self.scheduler} could not run a task ({one_line(error)})")

    def submit_each(self, fn, calls, on_done, label: str = "") -> None:
        from distributed import as_completed

        futures = [self.client.submit(_run_on_dask_worker, fn, args, kwargs, label, pure=False) for args, kwargs in calls]
        index_of = {future.key: index for index, future in enumerate(futures)}
        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as error:  # a lost worker, a task that cannot be pickled, a closed cluster
                    raise self._lost(error) from None
                on_done(index_of[future.key], outcome)
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def run(self, fn, calls, on_done, label: str = "") -> list[Outcome]:
        return _results_by_index(self, fn, calls, on_done, label)

    def start(self, fn, args: tuple, kwargs: dict, label: str = "") -> Callable[[], Outcome]:
        future = self.client.submit(_run_on_dask_worker, fn, args, kwargs, label, pure=False)

        def outcome() -> Outcome:
            try:
                return future.result()
            except Exception as error:
                raise self._lost(error) from None

        return outcome

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


class _DaskNested:
    """Tasks submitted by a task that runs on a dask worker: back to the same cluster."""

    workers = None
    scheduler = None

    def submit_each(self, fn, calls, on_done, label: str = "") -> None:
        from distributed import worker_client

        with worker_client() as client:
            futures = [client.submit(_run_on_dask_worker, fn, args, kwargs, label, pure=False) for args, kwargs in calls]
            for index, outcome in enumerate(client.gather(futures)):
                on_done(index, outcome)

    def run(self, fn, calls, on_done, label: str = "") -> list[Outcome]:
        return _results_by_index(self, fn, calls, on_done, label)

    def close(self) -> None:
        pass
