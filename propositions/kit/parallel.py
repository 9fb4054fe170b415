"""Independent pieces of a certificate as tasks: run inline, in a process pool or on a dask cluster.

Every frame of a claim is drawn from `rng_for(seed, *key)` with a key made of labels (claim, check,
shape, chunk), never from a generator shared between chunks, so the chunks of a loop over
`shape_plan(profile)` are independent computations. A claim hands such a loop to `map_chunks` (or a
list of calls to `map_tasks`): each task is one call of a top-level function that returns fresh
partial results (NumericalCheck objects filled by that chunk alone, counts), and the caller merges
the partials in *task order*, never in completion order, with `NumericalCheck.merge`, which
reproduces the sequential adds exactly. What a task computes does not depend on how many workers
there are, and one worker goes through the same task-and-merge path (inline), so a certificate is
bit for bit the same for any number of workers and on a cluster.

The executor is chosen once, where a command starts (`using(executor)` in certify/cli.py):

* `Inline()` (the default): tasks run one after another in this process.
* `Pool(workers)`: a ProcessPoolExecutor with the "spawn" start method (torch's and OpenBLAS's
  thread pools hang in a forked child), each worker limited to one BLAS thread as the command
  itself is (threadpoolctl), so that a worker rounds exactly as the command's process does.
* `Dask(address)`: a dask.distributed Client; the same tasks go to the cluster's workers, which are
  limited to one BLAS thread on connection. Its workers must round as this machine does (same
  libraries, same CPU kind): `Dask.check_fingerprint` compares their rounding fingerprint with ours.

Tasks submitted from inside a task (a claim that runs as a task of `certify all`) run inline in that
worker with a process pool, and go back to the cluster with dask (`worker_client`).

Warnings a task raises are recorded where it runs and raised again, in task order, by the caller,
so that a certificate's notes do not depend on where its chunks ran. An exception in a task becomes
one `TaskFailed` line naming the task; a worker that dies takes the pool with it and is reported
the same way, never as a hang.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence


class TaskFailed(RuntimeError):
    """A task raised, or its worker died: one line naming the task and the error.

    error_type / error_message: the class name and the message of the exception the task raised
    (None when the worker died), so that a caller can tell an expected error from a crash."""

    def __init__(self, message: str, error_type: str | None = None, error_message: str | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.error_message = error_message


# --------------------------------------------------------------------------------------------
# What runs in a worker
# --------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """What a task sends back: its result, or the error line; the warnings it raised, in order."""

    result: Any = None
    error: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    warnings: list = field(default_factory=list)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _on_dask_worker() -> bool:
    if "distributed" not in sys.modules:
        return False
    try:
        sys.modules["distributed"].get_worker()
        return True
    except (ValueError, AttributeError):
        return False


def _run_task(fn: Callable, args: tuple, kwargs: dict) -> _Outcome:
    """fn(*args, **kwargs) with its warnings recorded and its exception turned into a line.

    On a dask worker the task's own map_tasks calls go back to the cluster (_DaskNested).
    """
    global _EXECUTOR
    outcome = _Outcome()
    previous = _EXECUTOR
    if isinstance(previous, Inline) and _on_dask_worker():
        _EXECUTOR = _DaskNested()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome.result = fn(*args, **kwargs)
        except Exception as error:  # reported by the caller as TaskFailed, with where it happened
            frames = traceback.extract_tb(error.__traceback__)
            where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
            outcome.error = _one_line(error) + where
            outcome.error_type, outcome.error_message = type(error).__name__, " ".join(str(error).split())
        finally:
            _EXECUTOR = previous
    outcome.warnings = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
    return outcome


def _limit_blas_threads():
    """One thread for every BLAS library numpy and scipy load (both loaded first: threadpoolctl
    limits only the libraries already loaded). A thread count changes how BLAS splits a product,
    and so its rounding: a worker must run with the thread count of the process it stands in for."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def _limit_worker_blas_threads() -> None:
    _limit_blas_threads()  # for the life of the worker process


def _worker_start(progress_queue) -> None:
    """Initializer of a pool worker: one BLAS thread, nested tasks inline, progress to the queue."""
    global _EXECUTOR, _PROGRESS_QUEUE
    _limit_blas_threads()
    _EXECUTOR = Inline()
    _PROGRESS_QUEUE = progress_queue


# --------------------------------------------------------------------------------------------
# Executors
# --------------------------------------------------------------------------------------------


class Inline:
    """Tasks run one after another in this process (one worker)."""

    workers = 1
    scheduler = None

    def run(self, fn: Callable, calls: Sequence[tuple[tuple, dict]], on_done: Callable[[int], None]) -> list[_Outcome]:
        outcomes = []
        for args, kwargs in calls:
            # a copy, as a worker process gets one: no task sees what an earlier task did to its arguments
            outcomes.append(_run_task(fn, *copy.deepcopy((args, kwargs))))
            on_done(len(outcomes))
        return outcomes

    def submit_each(self, fn: Callable, calls: Sequence[tuple[tuple, dict]], on_done: Callable[[int, _Outcome], None]) -> None:
        for index, (args, kwargs) in enumerate(calls):
            on_done(index, _run_task(fn, *copy.deepcopy((args, kwargs))))

    def close(self) -> None:
        pass


class Pool:
    """A pool of `workers` processes started with "spawn", one BLAS thread each."""

    scheduler = None

    def __init__(self, workers: int):
        import multiprocessing

        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self._context = multiprocessing.get_context("spawn")
        self.progress_queue = self._context.Queue()
        self._pool = None

    def _executor(self):
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=self._context, initializer=_worker_start, initargs=(self.progress_queue,))
        return self._pool

    def _collect(self, futures: dict, on_done: Callable[[int, _Outcome], None]) -> None:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except BrokenProcessPool as error:
                    self._abandon()  # a fresh pool for the next tasks
                    raise TaskFailed(f"a worker process died while it ran a task ({_one_line(error)})") from None
                except Exception as error:  # a task or its result that cannot be pickled
                    raise TaskFailed(f"a task could not be sent to or back from a worker process ({_one_line(error)})") from None
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

    def submit_each(self, fn, calls, on_done) -> None:
        pool = self._executor()
        futures = {pool.submit(_run_task, fn, args, kwargs): index for index, (args, kwargs) in enumerate(calls)}
        self._collect(futures, on_done)

    def start(self, fn, args: tuple, kwargs: dict) -> Callable[[], _Outcome]:
        future = self._executor().submit(_run_task, fn, args, kwargs)

        def outcome() -> _Outcome:
            from concurrent.futures.process import BrokenProcessPool

            try:
                return future.result()
            except BrokenProcessPool as error:
                self._abandon()
                raise TaskFailed(f"a worker process died while it ran a task ({_one_line(error)})") from None
            except Exception as error:
                raise TaskFailed(f"a task could not be sent to or back from a worker process ({_one_line(error)})") from None

        return outcome

    def run(self, fn, calls, on_done) -> list[_Outcome]:
        outcomes: list = [None] * len(calls)
        done = 0

        def store(index, outcome):
            nonlocal done
            outcomes[index] = outcome  # by task index: the merge order never depends on completion
            done += 1
            on_done(done)

        self.submit_each(fn, calls, store)
        return outcomes

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class Dask:
    """The tasks go to a dask.distributed cluster (scheduler address, or a Client)."""

    def __init__(self, address):
        try:
            from distributed import Client
        except ImportError:
            raise ImportError("--scheduler needs dask.distributed, which is not installed (pip install 'stiefel-adam-certify[distributed]')") from None
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

    def submit_each(self, fn, calls, on_done) -> None:
        from distributed import as_completed

        futures = [self.client.submit(_run_task, fn, args, kwargs, pure=False) for args, kwargs in calls]
        index_of = {future.key: index for index, future in enumerate(futures)}
        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as error:  # a lost worker, a task that cannot be pickled, a closed cluster
                    raise TaskFailed(f"the dask cluster at {self.scheduler} could not run a task ({_one_line(error)})") from None
                on_done(index_of[future.key], outcome)
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def run(self, fn, calls, on_done) -> list[_Outcome]:
        return Pool.run(self, fn, calls, on_done)  # the same bookkeeping: results by task index

    def start(self, fn, args: tuple, kwargs: dict) -> Callable[[], _Outcome]:
        future = self.client.submit(_run_task, fn, args, kwargs, pure=False)

        def outcome() -> _Outcome:
            try:
                return future.result()
            except Exception as error:
                raise TaskFailed(f"the dask cluster at {self.scheduler} could not run a task ({_one_line(error)})") from None

        return outcome

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


class _DaskNested:
    """Tasks submitted by a task that runs on a dask worker: back to the same cluster."""

    workers = None
    scheduler = None

    def submit_each(self, fn, calls, on_done) -> None:
        from distributed import worker_client

        with worker_client() as client:
            futures = [client.submit(_run_task, fn, args, kwargs, pure=False) for args, kwargs in calls]
            for index, outcome in enumerate(client.gather(futures)):
                on_done(index, outcome)

    def run(self, fn, calls, on_done) -> list[_Outcome]:
        return Pool.run(self, fn, calls, on_done)


def _fingerprint_sha256() -> str:
    from certify import environment

    return environment.rounding_fingerprint()["sha256"]


# --------------------------------------------------------------------------------------------
# The current executor and progress
# --------------------------------------------------------------------------------------------

_EXECUTOR: Any = Inline()
_PROGRESS_QUEUE = None  # in a pool worker: where nested map_tasks report their progress
_PROGRESS: Callable[[str, int, int], None] | None = None  # in the command's process
_LABEL = ""  # what the running tasks belong to (a claim id), for progress lines


def current():
    """The executor map_tasks uses now."""
    return _EXECUTOR


@contextlib.contextmanager
def using(executor):
    """Run the map_tasks calls of the enclosed code on `executor` (closed on exit), with one BLAS
    thread here as in every worker, so that a task rounds the same wherever it runs."""
    global _EXECUTOR
    previous = _EXECUTOR
    _EXECUTOR = executor
    try:
        with _limit_blas_threads():
            yield executor
    finally:
        _EXECUTOR = previous
        executor.close()


@contextlib.contextmanager
def reporting(progress: Callable[[str, int, int], None] | None):
    """Call progress(label, tasks done, tasks in all) as the enclosed map_tasks calls advance."""
    global _PROGRESS
    previous = _PROGRESS
    _PROGRESS = progress
    try:
        yield
    finally:
        _PROGRESS = previous


@contextlib.contextmanager
def labelled(label: str):
    """Name the enclosed map_tasks calls in progress reports (the claim id)."""
    global _LABEL
    previous = _LABEL
    _LABEL = label
    try:
        yield
    finally:
        _LABEL = previous


def _report(label: str, done: int, total: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS(label, done, total)
    elif _PROGRESS_QUEUE is not None:
        try:
            _PROGRESS_QUEUE.put_nowait((label, done, total))
        except Exception:  # progress is a courtesy; a full or closed queue never fails a certificate
            pass


def _normalise(tasks: Iterable) -> list[tuple[tuple, dict]]:
    calls = []
    for task in tasks:
        if isinstance(task, Call):
            calls.append((tuple(task.args), dict(task.kwargs)))
        elif isinstance(task, tuple):
            calls.append((task, {}))
        else:
            calls.append(((task,), {}))
    return calls


@dataclass(frozen=True)
class Call:
    """One task's arguments: fn(*args, **kwargs)."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def map_tasks(fn: Callable, tasks: Iterable, *, label: str | None = None) -> list:
    """[fn(*task) for task in tasks] on the current executor, in task order.

    fn: a top-level (picklable) function; tasks: argument tuples, single arguments or `Call`s. The
    results come back in the order of `tasks` whatever order they finished in. Warnings raised by
    the tasks are raised again here in task order; the first task that raised gives TaskFailed.
    """
    calls = _normalise(tasks)
    name = label or f"{_LABEL + ' ' if _LABEL else ''}{getattr(fn, '__name__', 'task')}"
    if not calls:
        return []
    _report(name, 0, len(calls))
    outcomes = _EXECUTOR.run(fn, calls, lambda done: _report(name, done, len(calls)))
    results = []
    for index, outcome in enumerate(outcomes):
        for message, category, filename, lineno in outcome.warnings:
            warnings.warn_explicit(message, category, filename, lineno)
        if outcome.error is not None:
            raise TaskFailed(f"task {index + 1} of {len(calls)} of {getattr(fn, '__qualname__', fn)} failed: {outcome.error}",
                             outcome.error_type, outcome.error_message)
        results.append(outcome.result)
    return results


class Pending:
    """A task started now, its result collected later by result() (see start)."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self._fn, self._args, self._kwargs = fn, args, kwargs
        starter = getattr(_EXECUTOR, "start", None)
        self._collect = starter(fn, args, kwargs) if starter is not None else None
        self._outcome: _Outcome | None = None

    def result(self):
        """fn's result; its warnings are raised here (once), its error is TaskFailed."""
        if self._outcome is None:
            if self._collect is not None:
                self._outcome = self._collect()
            else:  # inline: run now, on a copy of the arguments as a worker would get them
                self._outcome = _run_task(self._fn, *copy.deepcopy((self._args, self._kwargs)))
            for message, category, filename, lineno in self._outcome.warnings:
                warnings.warn_explicit(message, category, filename, lineno)
        if self._outcome.error is not None:
            raise TaskFailed(f"{getattr(self._fn, '__qualname__', self._fn)} failed: {self._outcome.error}",
                             self._outcome.error_type, self._outcome.error_message)
        return self._outcome.result


def start(fn: Callable, *args, **kwargs) -> Pending:
    """fn(*args, **kwargs) as a task that starts now on a pool or a cluster and runs while the caller
    goes on (a claim's symbolic derivation or long run beside its chunk maps); inline, it runs when
    its result is asked for. Either way its result and warnings arrive at result(), so where it ran
    does not change the certificate."""
    return Pending(fn, args, kwargs)


# --------------------------------------------------------------------------------------------
# Chunked loops
# --------------------------------------------------------------------------------------------


class Chunks:
    """Which chunks of a chunked loop one call runs: every chunk (only=None), or the only-th.

    A loop over shape_plan(profile) and chunk_sizes(...) calls `take()` once per chunk, first
    thing in the loop body, and skips the chunk when it returns False. With only=-1 no chunk runs
    and `seen` counts them: that is how map_chunks learns how many tasks there are.
    """

    def __init__(self, only: int | None = None):
        self.only = only
        self.seen = 0

    def take(self) -> bool:
        index = self.seen
        self.seen += 1
        return self.only is None or index == self.only


def _chunk_task(fn: Callable, index: int, args: tuple, kwargs: dict):
    return fn(*args, chunks=Chunks(index), **kwargs)


def map_chunks(fn: Callable, *args, task_label: str | None = None, **kwargs) -> list:
    """fn(*args, chunks=Chunks(k), **kwargs) for every chunk k of fn's loop, as tasks; the results in chunk order.

    fn must take a keyword `chunks` (a Chunks) and call chunks.take() once per chunk in a fixed
    order; it is called once first with no chunk taken, to count them (its own setup outside the
    chunk loop must be cheap). The caller merges the partial results in the order returned.
    task_label: what progress reports call these tasks (default fn's name).
    """
    counter = Chunks(only=-1)
    fn(*args, chunks=counter, **kwargs)
    return map_tasks(_chunk_task, [(fn, index, args, kwargs) for index in range(counter.seen)], label=f"{_LABEL + ' ' if _LABEL else ''}{task_label or fn.__name__}")


def merge_checks(partials: Iterable[Sequence]) -> list:
    """Each position's NumericalCheck merged over the partials, in the partials' order.

    partials: per task, a sequence of NumericalCheck (the same names in the same positions).
    """
    merged = None
    for checks in partials:
        if merged is None:
            merged = list(checks)
            continue
        for mine, theirs in zip(merged, checks):
            mine.merge(theirs)
    return merged or []


__all__ = ["Inline", "Pool", "Dask", "TaskFailed", "Call", "Chunks", "Pending", "current", "using", "reporting", "labelled", "map_tasks", "map_chunks", "merge_checks", "start"]
