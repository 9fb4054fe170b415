"""Independent pieces of a certificate as tasks, and the slot of the executor that runs them.

Every frame of a claim is drawn from `rng_for(seed, *key)` with a key made of labels (claim, check,
shape, chunk), never from a generator shared between chunks, so the chunks of a loop over
`shape_plan(profile)` are independent computations. A claim lists the chunks of such a loop and
hands them to `map_chunks` (or a list of calls to `map_tasks`): each task is one call of a
top-level function on one chunk that returns its own evidence (kit.protocol.Evidence: checks filled
by that chunk alone, counts), and the caller merges them in *task order*, never in completion
order, with `Evidence.merged`, whose `NumericalCheck.merge` reproduces the sequential adds exactly.
What a task computes does not depend on how many workers there are, and one worker goes through
the same task-and-merge path (inline), so a certificate is bit for bit the same for any number of
workers and on a cluster.

This module knows nothing about processes or clusters. It holds the slot of the current executor
(`current()`, `installed(executor)`), which is `Inline()` unless a caller installs another; the
executors that run tasks elsewhere (a process pool, dask.distributed) live in certify/execution.py,
which chooses one where a command starts. An executor is any object with

* `run(fn, calls, on_done, label) -> [Outcome]`: every call `fn(*args, **kwargs)` through
  `run_task(fn, args, kwargs, label)`, the outcomes by call index, `on_done(done)` after each one;
* optionally `start(fn, args, kwargs, label) -> (() -> Outcome)`: a task that starts now (`start`);
* `workers`, `scheduler`: what the run record says about it; `close()`.

Warnings a task raises are recorded where it runs (`run_task`) and raised again, in task order, by
the caller, so that a certificate's notes do not depend on where its chunks ran. An exception in a
task becomes one `TaskFailed` line naming the task.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
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
# One task
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a task sends back: its result, or the error line; the warnings it raised, in order."""

    result: Any = None
    error: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    warnings: list = field(default_factory=list)
    # (label, seconds) of this task's own work and of every task it ran in turn (see timing())
    timings: list = field(default_factory=list)
    # the draw keys (group, spawn key) it and the tasks it ran in turn asked rng_for for (see drawing())
    draws: list = field(default_factory=list)


def one_line(error: BaseException) -> str:
    """An exception as one line: its class name and its message with the whitespace collapsed."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _name(fn) -> str:
    """A task function's name for progress and timings (a functools.partial: its function's)."""
    return getattr(getattr(fn, "func", fn), "__name__", "task")


def run_task(fn: Callable, args: tuple, kwargs: dict, label: str = "") -> Outcome:
    """fn(*args, **kwargs) with its warnings recorded and its exception turned into a line: what
    every executor calls for one task, wherever the task runs. Its timings: (label, the seconds
    of its own work) and, after it, the entries of the tasks it ran in turn."""
    outcome = Outcome()
    started = time.perf_counter()
    frames_open = _timing_frames()
    nested: list = []
    frames_open.append(nested)
    draws_open = _draw_frames()
    drawn: set = set()
    draws_open.append(drawn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome.result = fn(*args, **kwargs)
        except Exception as error:  # reported by the caller as TaskFailed, with where it happened
            frames = traceback.extract_tb(error.__traceback__)
            where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
            outcome.error = one_line(error) + where
            outcome.error_type, outcome.error_message = type(error).__name__, " ".join(str(error).split())
        finally:
            _close(frames_open, nested)
            _close(draws_open, drawn)
    outcome.draws = sorted(drawn)
    outcome.warnings = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
    own = time.perf_counter() - started - sum(seconds for _, seconds in nested)
    outcome.timings = [(label or _name(fn), max(own, 0.0))] + nested
    return outcome


# What a thread is running now: its executor (None: the process's), the label of its tasks and its
# open timing frames (run_task's and timing()'s, innermost last). Per thread, because a dask worker
# may start another claim in the same process while one waits for its tasks (worker_client).
_THREAD = threading.local()


def _thread_frames(name: str) -> list:
    """This thread's open frames of one kind ("timings", "draws"), innermost last."""
    frames = getattr(_THREAD, name, None)
    if frames is None:
        frames = []
        setattr(_THREAD, name, frames)
    return frames


def _timing_frames() -> list:
    return _thread_frames("timings")


def _draw_frames() -> list:
    return _thread_frames("draws")


def _close(frames_open: list, frame: list) -> None:
    """Take `frame` off this thread's open frames (by identity; nothing if it is gone)."""
    for index in range(len(frames_open) - 1, -1, -1):
        if frames_open[index] is frame:
            del frames_open[index]
            return


@contextlib.contextmanager
def _opened(frames_open: list, frame):
    """`frame` open as the innermost of `frames_open` while the enclosed code runs."""
    frames_open.append(frame)
    try:
        yield frame
    finally:
        _close(frames_open, frame)


def timing():
    """Collect the (label, seconds) of every task that the enclosed code runs, wherever it runs:
    a list, filled when the code ends. Entries are each task's own work (a task that maps tasks in
    turn counts its own part only), so that on one worker they add up to the time spent in tasks."""
    return _opened(_timing_frames(), [])


def _record(outcome: Outcome) -> None:
    frames_open = _timing_frames()
    if frames_open:
        frames_open[-1].extend(outcome.timings)
    draws_open = _draw_frames()
    if draws_open:
        draws_open[-1].update(outcome.draws)


# --------------------------------------------------------------------------------------------
# The draw ledger
# --------------------------------------------------------------------------------------------


def note_draw(group: str, key: tuple) -> None:
    """Record that a stream with spawn key `key` of draw group `group` was asked for (rng_for calls
    this), in the innermost open drawing() frame of this thread or task; nothing when none is open."""
    frames = getattr(_THREAD, "draws", None)
    if frames:
        frames[-1].add((group, tuple(key)))


def drawing():
    """Collect the distinct draw keys, (group, spawn key), that the enclosed code asks rng_for for,
    wherever its tasks run (each task's Outcome carries its own back, like its timings): a set,
    filled as the code runs. Two call sites, or two chunks, that ask for one key draw the same
    numbers; a call site whose key lost the part that varies per shape, dtype or chunk asks for
    fewer distinct keys, which the coverage contract counts (propositions/coverage_contract.py)."""
    return _opened(_draw_frames(), set())


class Inline:
    """Tasks run one after another in this process (one worker): the default executor."""

    workers = 1
    scheduler = None

    def run(self, fn: Callable, calls: Sequence[tuple[tuple, dict]], on_done: Callable[[int], None], label: str = "") -> list[Outcome]:
        outcomes = []
        for args, kwargs in calls:
            # a copy, as a worker process gets one: no task sees what an earlier task did to its arguments
            outcomes.append(run_task(fn, *copy.deepcopy((args, kwargs)), label))
            on_done(len(outcomes))
        return outcomes

    def submit_each(self, fn: Callable, calls: Sequence[tuple[tuple, dict]], on_done: Callable[[int, Outcome], None], label: str = "") -> None:
        for index, (args, kwargs) in enumerate(calls):
            on_done(index, run_task(fn, *copy.deepcopy((args, kwargs)), label))

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# The current executor and progress
# --------------------------------------------------------------------------------------------

_EXECUTOR: Any = Inline()  # the process's executor; a thread may install its own (installed)
_PROGRESS: Callable[[str, int, int], None] | None = None  # where progress goes (the command's, or a worker's queue)


def current():
    """The executor map_tasks uses now, in this thread."""
    installed_here = getattr(_THREAD, "executor", None)
    return installed_here if installed_here is not None else _EXECUTOR


def _label() -> str:
    return getattr(_THREAD, "label", "")


@contextlib.contextmanager
def installed(executor):
    """Run the map_tasks calls of the enclosed code, in this thread, on `executor` (neither set up
    nor closed here: certify.execution.using does that)."""
    previous = getattr(_THREAD, "executor", None)
    _THREAD.executor = executor
    try:
        yield executor
    finally:
        _THREAD.executor = previous


def install_for_process(executor, progress: Callable[[str, int, int], None] | None = None) -> None:
    """Set this process's executor and progress sink for good (a worker process's initializer)."""
    global _EXECUTOR, _PROGRESS
    _EXECUTOR, _PROGRESS = executor, progress


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
    """Name the enclosed map_tasks calls, in this thread, in progress reports (the claim id)."""
    previous = _label()
    _THREAD.label = label
    try:
        yield
    finally:
        _THREAD.label = previous


def _report(label: str, done: int, total: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS(label, done, total)


# --------------------------------------------------------------------------------------------
# Mapping tasks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One task's arguments: fn(*args, **kwargs)."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


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


def _replay(outcome: Outcome) -> None:
    for message, category, filename, lineno in outcome.warnings:
        warnings.warn_explicit(message, category, filename, lineno)


def map_tasks(fn: Callable, tasks: Iterable, *, label: str | None = None) -> list:
    """[fn(*task) for task in tasks] on the current executor, in task order.

    fn: a top-level (picklable) function; tasks: argument tuples, single arguments or `Call`s. The
    results come back in the order of `tasks` whatever order they finished in. Warnings raised by
    the tasks are raised again here in task order; the first task that raised gives TaskFailed.
    """
    calls = _normalise(tasks)
    name = label or f"{_label() + ' ' if _label() else ''}{_name(fn)}"
    if not calls:
        return []
    _report(name, 0, len(calls))
    outcomes = current().run(fn, calls, lambda done: _report(name, done, len(calls)), label=name)
    for outcome in outcomes:  # every task's time, those after a failed one included
        _record(outcome)
    results = []
    for index, outcome in enumerate(outcomes):
        _replay(outcome)
        if outcome.error is not None:
            raise TaskFailed(f"task {index + 1} of {len(calls)} of {name} failed: {outcome.error}",
                             outcome.error_type, outcome.error_message)
        results.append(outcome.result)
    return results


class Pending:
    """A task started now, its result collected later by result() (see start)."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, name: str | None = None):
        self._fn, self._args, self._kwargs = fn, args, kwargs
        starter = getattr(current(), "start", None)
        self._label = f"{_label() + ' ' if _label() else ''}{name or _name(fn)}"
        self._collect = starter(fn, args, kwargs, label=self._label) if starter is not None else None
        self._outcome: Outcome | None = None

    def result(self):
        """fn's result; its warnings are raised here (once), its error is TaskFailed."""
        if self._outcome is None:
            if self._collect is not None:
                self._outcome = self._collect()
            else:  # inline: run now, on a copy of the arguments as a worker would get them
                self._outcome = run_task(self._fn, *copy.deepcopy((self._args, self._kwargs)), self._label)
            _record(self._outcome)
            _replay(self._outcome)
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


def start_named(name: str, fn: Callable, *args, **kwargs) -> Pending:
    """start, with the task named `name` in progress and timings (default: fn's name)."""
    return Pending(fn, args, kwargs, name)


# --------------------------------------------------------------------------------------------
# Chunked loops
# --------------------------------------------------------------------------------------------


def _chunk_task(fn: Callable, chunk, args: tuple, kwargs: dict):
    return fn(chunk, *args, **kwargs)


def map_chunks(fn: Callable, chunks: Sequence, *args, task_label: str | None = None, **kwargs) -> list:
    """fn(chunk, *args, **kwargs) for every chunk of `chunks`, one task each; the results in chunk order.

    chunks: the descriptors of a chunked loop (for example kit.running_bounds.plan_chunks of a
    shape plan), listed by the caller before anything runs, so that their number and order never
    depend on the executor. The caller merges the results in the order returned
    (kit.protocol.Evidence.merged). task_label: what progress reports call these tasks (default fn's name).
    """
    return map_tasks(_chunk_task, [(fn, chunk, args, kwargs) for chunk in chunks],
                     label=f"{_label() + ' ' if _label() else ''}{task_label or fn.__name__}")


__all__ = ["timing", "Inline", "Outcome", "TaskFailed", "Call", "Pending", "current", "installed", "install_for_process", "reporting", "labelled", "run_task", "one_line", "drawing", "note_draw", "map_tasks", "map_chunks", "start", "start_named"]
