"""Parallel certification (propositions.kit.parallel): the same certificate for any executor.

A certificate, digest included, must be bit for bit the same whether its chunk tasks run inline,
in a pool of 2 or 4 processes, or on a dask cluster, and whether the claims themselves run as tasks
(`certify run A B --workers N`). That rests on NumericalCheck.merge reproducing the sequential
adds exactly and on the partial results being merged in task order; the tests below break each.
"""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from certify import certificate as certificate_format
from certify import claims, cli, execution
from propositions._common import NumericalCheck, to_jsonable
from propositions.kit import parallel
from propositions.kit.protocol import Counts, Evidence

CLAIMS = ("P1", "P5")  # chunked claims, about three seconds each at the quick profile


def _evidence(certificate: dict) -> dict:
    """Everything the digest covers (all but `run` and `digest`)."""
    return {key: value for key, value in certificate.items() if key not in certificate_format.UNSEALED_MEMBERS}


def _certify(claim_id: str, executor) -> dict:
    with execution.using(executor):
        sealed, internal_error = claims.certify_claim(claim_id, seed=0, profile="quick", command="test", workers=executor.workers, scheduler=executor.scheduler)
    assert internal_error is None
    return sealed


@pytest.fixture(scope="module")
def inline_certificates():
    return {claim_id: _certify(claim_id, parallel.Inline()) for claim_id in CLAIMS}


def _assert_same(certificate: dict, reference: dict) -> None:
    assert certificate["verdict"] == "pass"
    assert certificate["digest"] == reference["digest"]
    assert certificate_format.canonical_json(_evidence(certificate)) == certificate_format.canonical_json(_evidence(reference))


@pytest.mark.parametrize("workers", [2, 4])
def test_chunk_tasks_in_a_pool_give_the_inline_certificate(inline_certificates, workers):
    pool = execution.Pool(workers)
    with execution.using(pool):
        for claim_id in CLAIMS:
            sealed, internal_error = claims.certify_claim(claim_id, seed=0, profile="quick", command="test", workers=workers)
            assert internal_error is None
            assert sealed["run"]["workers"] == workers
            _assert_same(sealed, inline_certificates[claim_id])


def test_claims_as_tasks_give_the_inline_certificates(inline_certificates, tmp_path, capsys):
    """`certify run P1 P5 --workers 2`: each claim runs in a worker process, its chunks inline there."""
    assert cli.main(["run", *CLAIMS, "--profile", "quick", "--workers", "2", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # a log (not a terminal) gets plain lines: what runs where, one line per claim started and done
    assert lines[0] == "running 2 claims on 2 worker processes (seed 0, profile quick)"
    assert lines[1:3] == ["P1: running (seed 0, profile quick)", "P5: running (seed 0, profile quick)"]
    assert sorted(line.split(" in ")[0] for line in lines[3:5]) == ["P1: pass", "P5: pass"]
    for claim_id in CLAIMS:
        certificate = certificate_format.load(tmp_path / f"{claim_id}.json")
        assert certificate["run"]["workers"] == 2 and "--workers 2" in certificate["run"]["command"]
        _assert_same(certificate, inline_certificates[claim_id])


def test_a_dask_cluster_gives_the_inline_certificates(inline_certificates, tmp_path):
    """Claims as tasks on a 2-worker LocalCluster; their chunks go back to the cluster (worker_client)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        assert cli.main(["run", *CLAIMS, "--profile", "quick", "--scheduler", cluster.scheduler_address, "--out", str(tmp_path)]) == 0
        # and one claim from this process, its chunks on the cluster
        executor = execution.Dask(cluster.scheduler_address)
        single = _certify("P1", executor)
    for claim_id in CLAIMS:
        certificate = certificate_format.load(tmp_path / f"{claim_id}.json")
        assert certificate["run"]["scheduler"] == cluster.scheduler_address
        _assert_same(certificate, inline_certificates[claim_id])
    _assert_same(single, inline_certificates["P1"])


class _CompletionOrder(parallel.Inline):
    """An executor that finishes the tasks last to first and hands them back in that order: what a
    pool whose results were merged in completion order would give."""

    def run(self, fn, calls, on_done, label=""):
        outcomes = [parallel.run_task(fn, args, kwargs) for args, kwargs in reversed(calls)]
        on_done(len(outcomes))
        return outcomes


def test_merging_in_completion_order_changes_the_certificate(inline_certificates):
    """The identity above is not automatic: merged in another order, P1's certificate differs."""
    shuffled = _certify("P1", _CompletionOrder())
    assert shuffled["digest"] != inline_certificates["P1"]["digest"]


def test_the_run_record_is_outside_the_digest(inline_certificates):
    certificate = json.loads(json.dumps(inline_certificates["P1"]))
    certificate["run"]["wall_seconds"] += 100.0
    certificate["run"]["workers"] = 64
    assert certificate_format.compute_digest(certificate) == certificate["digest"]["value"]
    certificate["numerical"]["frames"] += 1
    assert certificate_format.compute_digest(certificate) != certificate["digest"]["value"]


# --------------------------------------------------------------------------------------------
# NumericalCheck.merge
# --------------------------------------------------------------------------------------------

_values = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _adds(draw):
    """A sequence of adds (residuals, bounds, shape, key) and the points that split it into tasks."""
    count = draw(st.integers(1, 8))
    adds = []
    for index in range(count):
        size = draw(st.integers(1, 6))
        residual = draw(st.lists(st.one_of(_values, st.just(float("nan")), st.just(float("inf"))), min_size=size, max_size=size))
        bound = draw(st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=size, max_size=size))
        adds.append((np.array(residual), np.array(bound), (draw(st.integers(1, 3)), 1), ("chunk", index)))
    splits = sorted(draw(st.sets(st.integers(1, count - 1), max_size=count - 1))) if count > 1 else []
    return adds, splits


def _check(adds) -> NumericalCheck:
    check = NumericalCheck("c", "d", "b")
    for residual, bound, shape, key in adds:
        check.add(residual, bound, shape=shape, key=key, seed=0)
    return check


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # quantiles of pools holding inf
@given(_adds())
def test_merge_equals_the_sequential_adds(case):
    adds, splits = case
    edges = [0, *splits, len(adds)]
    partials = [_check(adds[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]
    merged = NumericalCheck("c", "d", "b")
    for partial in partials:
        merged.merge(partial)
    assert json.dumps(to_jsonable(merged.to_dict())) == json.dumps(to_jsonable(_check(adds).to_dict()))


def test_merge_refuses_another_check():
    with pytest.raises(ValueError, match="cannot merge check 'other' into check 'c'"):
        NumericalCheck("c", "d", "b").merge(NumericalCheck("other", "d", "b"))


def test_merging_sums_of_partial_sums_is_not_the_sequential_sum():
    """Why merge replays each add's sum: adding partial sums associates differently, and the mean differs."""
    # (1 + 2^-53) + 2^-53 = 1 (each half ulp rounds to even), 1 + (2^-53 + 2^-53) = 1 + 2^-52
    adds = [(np.array([1.0]), np.array([1.0]), (1, 1), (0,))] + [(np.array([2.0**-53]), np.array([1.0]), (1, 1), (i,)) for i in (1, 2)]
    sequential = _check(adds)
    assert sequential._sum_residual == 1.0
    grouped_sum = _check(adds[:1])._sum_residual + _check(adds[1:])._sum_residual
    assert grouped_sum == 1.0 + 2.0**-52
    merged = _check(adds[:1]).merge(_check(adds[1:]))
    assert merged._sum_residual == sequential._sum_residual


# --------------------------------------------------------------------------------------------
# Failures and warnings
# --------------------------------------------------------------------------------------------


def _square_or_fail(x: int) -> int:
    if x == 3:
        raise ArithmeticError("three is not allowed\nsecond line")
    return x * x


def _warn_and_return(x: int) -> int:
    warnings.warn(f"task {x} warns", RuntimeWarning)
    return x


def _die(x: int) -> int:
    if x == 1:
        os._exit(7)
    return x


@pytest.mark.parametrize("make", [parallel.Inline, lambda: execution.Pool(2)], ids=["inline", "pool"])
def test_a_failing_task_is_one_line_naming_it(make):
    with execution.using(make()):
        assert parallel.map_tasks(_square_or_fail, [0, 1, 2]) == [0, 1, 4]
        with pytest.raises(parallel.TaskFailed) as failure:
            parallel.map_tasks(_square_or_fail, [0, 1, 2, 3, 4])
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("task 4 of 5 of _square_or_fail failed: ArithmeticError: three is not allowed second line (test_parallel.py:")
    # the exception's class and message travel with it: a caller tells an expected error from a crash
    assert failure.value.error_type == "ArithmeticError"
    assert failure.value.error_message == "three is not allowed second line"


def test_a_failing_chunk_task_names_the_check_not_the_wrapper():
    with pytest.raises(parallel.TaskFailed, match=r"^task 4 of 5 of projector_checks failed: ArithmeticError"):
        parallel.map_chunks(_square_or_fail, [0, 1, 2, 3, 4], task_label="projector_checks")


def test_a_dying_worker_is_reported_not_waited_for():
    with execution.using(execution.Pool(2)):
        with pytest.raises(parallel.TaskFailed, match="a worker process died while it ran a task"):
            parallel.map_tasks(_die, [0, 1, 2, 3])
        # the pool is replaced: later tasks run
        assert parallel.map_tasks(_square_or_fail, [2]) == [4]


@pytest.mark.parametrize("make", [parallel.Inline, lambda: execution.Pool(2)], ids=["inline", "pool"])
def test_warnings_come_back_in_task_order(make):
    with execution.using(make()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert parallel.map_tasks(_warn_and_return, [0, 1, 2]) == [0, 1, 2]
    assert [str(w.message) for w in caught] == ["task 0 warns", "task 1 warns", "task 2 warns"]
    assert all(w.category is RuntimeWarning for w in caught)


def _filled(name: str, residuals) -> NumericalCheck:
    check = NumericalCheck(name, "a residual", "a bound of 1")
    check.add(np.asarray(residuals, dtype=float), 1.0, shape=(2, 1))
    return check


def test_evidence_merges_checks_counts_records_and_agreed_values():
    first = Evidence(checks=[_filled("a", [0.1, 0.5]), _filled("b", [0.2])], frames=3,
                     extra={"counts": Counts(vacuous=1, by_shape=Counts({"x": [1, 0, 2]})), "records": [1], "setting": {"lr": 0.1}},
                     notes=["same note"], inconclusive=["a reason"])
    second = Evidence(checks=[_filled("b", [0.9]), _filled("c", [0.3])], frames=2,
                      extra={"counts": Counts(vacuous=2, by_shape=Counts({"x": [0, 1, 0], "y": [1, 1, 1]})), "records": [2, 3],
                             "setting": {"lr": 0.1}}, notes=["same note", "another"])
    merged = Evidence.merged([first, second])
    assert [check.name for check in merged.checks] == ["a", "b", "c"]
    assert merged.check("b").samples == 2 and merged.check("b").max_ratio == 0.9
    assert merged.frames == 5
    assert merged.extra == {"counts": {"vacuous": 3, "by_shape": {"x": [1, 1, 2], "y": [1, 1, 1]}}, "records": [1, 2, 3],
                            "setting": {"lr": 0.1}}
    assert merged.notes == ["same note", "another"] and merged.inconclusive == ["a reason"]
    # the partials' own extra is not changed by the merge (a copy is taken of what is merged into)
    assert first.extra["counts"] == {"vacuous": 1, "by_shape": {"x": [1, 0, 2]}} and first.extra["records"] == [1]
    assert Evidence.merged([]).checks == [] and Evidence.merged([]).frames == 0
    # merging never changes a partial: the same partials merged again give the same evidence
    assert first.check("a").samples == 2 and second.check("b").samples == 1
    assert Evidence.merged([first, second]).check("b").samples == 2
    assert merged.extra["setting"] is not first.extra["setting"]
    # the order of the checks is that of their first appearance
    assert [c.name for c in Evidence.merged([Evidence(checks=[_filled("a", [0.1]), _filled("b", [0.1])]),
                                             Evidence(checks=[_filled("a", [0.1]), _filled("c", [0.1])])]).checks] == ["a", "b", "c"]
    assert Evidence.merged([Evidence(notes=["n", "n"]), Evidence(notes=["n"])]).notes == ["n"]
    assert Evidence.merged([Evidence(extra={"x": float("nan")}), Evidence(extra={"x": float("nan")})]).extra["x"] != 0
    with pytest.raises(KeyError, match="no check 'z'"):
        merged.check("z")


def test_evidence_refuses_chunks_that_disagree():
    with pytest.raises(ValueError, match=r"extra\['setting'\]\['lr'\]: 0.1 in one chunk, 0.2 in a later one"):
        Evidence.merged([Evidence(extra={"setting": {"lr": 0.1}}), Evidence(extra={"setting": {"lr": 0.2}})])
    with pytest.raises(ValueError, match="two chunks draw the figure"):
        Evidence.merged([Evidence(figures={"f": 1}), Evidence(figures={"f": 2})])
    with pytest.raises(ValueError, match=r"extra\['counts'\]: a Counts in one chunk, a dict in a later one"):
        Evidence.merged([Evidence(extra={"counts": Counts(n=1)}), Evidence(extra={"counts": {"n": 1}})])
    with pytest.raises(ValueError, match="tally of 2 entries to one of 3"):
        Counts(x=[1, 2, 3]).add({"x": [1, 2]})


@given(st.lists(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=5), min_size=1, max_size=6), st.data())
def test_merged_chunk_evidence_is_the_same_however_the_chunks_are_grouped(chunks, data):
    """Merging the chunks in order, all at once or first in groups, gives the same certificate entry."""
    cut = data.draw(st.integers(0, len(chunks)))

    def evidence(residuals):
        return Evidence(checks=[_filled("a", residuals)], frames=len(residuals), extra={"counts": Counts(n=len(residuals))})

    at_once = Evidence.merged(evidence(r) for r in chunks)
    grouped = Evidence.merged([Evidence.merged(evidence(r) for r in chunks[:cut]), Evidence.merged(evidence(r) for r in chunks[cut:])])
    assert to_jsonable(grouped.check("a").to_dict()) == to_jsonable(at_once.check("a").to_dict())
    assert grouped.frames == at_once.frames and grouped.extra == at_once.extra


def test_a_failing_claim_task_is_an_inconclusive_certificate_with_one_line(monkeypatch, tmp_path):
    """A TaskFailed inside a claim's run does not stop the command: the certificate says what failed."""

    def failing(*args, **kwargs):
        raise parallel.TaskFailed("task 2 of 9 of projector_checks failed: MemoryError")

    monkeypatch.setattr("propositions.p1_steepest_descent.map_evidence", failing)
    sealed, internal_error = claims.certify_claim("P1", seed=0, profile="quick", command="test")
    assert internal_error is None and sealed["verdict"] == "inconclusive"
    reason = sealed["inconclusive"][0]
    assert reason.startswith("P1 raised while it ran: TaskFailed: task 2 of 9 of projector_checks failed: MemoryError") and "\n" not in reason


def test_workers_and_scheduler_exclude_each_other(capsys):
    assert cli.main(["run", "P1", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "--workers and --scheduler exclude each other" in capsys.readouterr().err


@pytest.mark.parametrize("make", [parallel.Inline, lambda: execution.Pool(2)], ids=["inline", "pool"])
def test_a_started_task_gives_its_result_warnings_and_error_at_result(make):
    with execution.using(make()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pending, failing = parallel.start(_warn_and_return, 5), parallel.start(_square_or_fail, 3)
        assert parallel.map_tasks(_square_or_fail, [2]) == [4]  # other tasks run meanwhile
        assert caught == []  # nothing before result(): the same order inline and on a pool
        assert pending.result() == 5 and pending.result() == 5
        with pytest.raises(parallel.TaskFailed, match=r"^_square_or_fail failed: ArithmeticError: three is not allowed second line"):
            failing.result()
    assert [str(w.message) for w in caught] == ["task 5 warns"]


def _leaf(x: int) -> int:
    return x + 1


def _outer(n: int) -> int:
    return sum(parallel.map_tasks(_leaf, range(n), label="leaf"))


@pytest.mark.parametrize("make", [parallel.Inline, lambda: execution.Pool(2)], ids=["inline", "pool"])
def test_task_timings_name_every_task_once_wherever_it_ran(make):
    # two outer tasks that map three leaf tasks each: 2 + 6 entries, each task's own work once
    with execution.using(make()), parallel.timing() as timings:
        assert parallel.map_tasks(_outer, [3, 3], label="outer") == [6, 6]
    labels = [label for label, _ in timings]
    assert labels.count("outer") == 2 and labels.count("leaf") == 6 and len(labels) == 8
    assert all(seconds >= 0 for _, seconds in timings)


def test_a_certificate_records_its_task_times_outside_the_digest(inline_certificates):
    tasks = inline_certificates["P5"]["run"]["tasks"]
    assert "serial" in tasks and all(seconds >= 0 for times in tasks.values() for seconds in times)
    # inline, the tasks and the serial work add up to the claim's wall time (rounded to 1e-4 s each)
    total = sum(sum(times) for times in tasks.values())
    assert abs(total - inline_certificates["P5"]["run"]["wall_seconds"]) <= 1e-4 * (1 + sum(len(t) for t in tasks.values()))




_EVENTS: dict = {}  # tasks get copies of their arguments: the events are named, not passed


def test_timing_frames_belong_to_their_thread():
    # a dask worker may start a second claim in the same process while the first waits for its
    # tasks (worker_client): each thread's timing() must collect its own tasks, and closing one
    # must not disturb the other
    import threading

    # A's task is running when B opens its frame and starts a task; A's task ends while B's runs
    _EVENTS.update(a_inside=threading.Event(), b_inside=threading.Event(), a_finished=threading.Event())
    found: dict = {}

    def claim_a():
        with parallel.timing() as timings:
            parallel.map_tasks(_signal_then_wait, [("a_inside", "b_inside")], label="a")
        found["a"] = [label for label, _ in timings]
        _EVENTS["a_finished"].set()

    def claim_b():
        assert _EVENTS["a_inside"].wait(10)
        with parallel.timing() as timings:
            parallel.map_tasks(_signal_then_wait, [("b_inside", "a_finished")], label="b")
            parallel.map_tasks(_leaf, [1], label="b")
        found["b"] = [label for label, _ in timings]

    threads = [threading.Thread(target=claim_a), threading.Thread(target=claim_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert found == {"a": ["a"], "b": ["b", "b"]}


def _signal_then_wait(inside: str, done: str) -> int:
    _EVENTS[inside].set()
    assert _EVENTS[done].wait(10)
    return 1


def _register_exit_marker(path: str) -> int:
    import atexit

    atexit.register(lambda: open(path, "a").write("handler ran\n"))
    return os.getpid()


def test_pool_workers_run_their_exit_handlers_and_end_with_code_0(tmp_path):
    """Workers end without the interpreter's teardown (execution._WorkerProcess): the exit handlers
    that tasks registered still run, and the exit code is 0."""
    from certify import execution

    pool = execution.Pool(2)
    markers = [str(tmp_path / f"marker{i}") for i in range(4)]
    outcomes = pool.run(_register_exit_marker, [((m,), {}) for m in markers], lambda done: None)
    processes = list(pool._executor()._processes.values())
    pool.close()
    assert all(outcome.error is None for outcome in outcomes)
    assert [p.exitcode for p in processes] == [0] * len(processes)
    ran = [m for m in markers if os.path.exists(m)]
    assert len(ran) == len(markers), ran


@given(residual=st.one_of(st.floats(min_value=0.0, allow_infinity=True), st.sampled_from([0.0, 1.0, 1e-300, 5e-324, math.nan, math.inf])),
       bound=st.floats(min_value=5e-324, max_value=1e300), earlier=st.floats(min_value=0.0, max_value=10.0))
def test_one_sample_is_recorded_as_the_array_path_records_it(residual, bound, earlier):
    """add() takes a single sample on Python floats (_add_one): the record, histogram, pools and worst case
    are those of the array path (_add_array) for the same sample, after earlier samples."""
    one, array = NumericalCheck("c", "d", "b"), NumericalCheck("c", "d", "b")
    for check in (one, array):
        check.add(np.array([earlier, 2 * earlier]), 1.0, shape=(3, 2), key=("k", 1), seed=0)
    one._add_one(residual, bound, (4, 2), ("k", 2), 0, {"x": 1})
    with np.errstate(over="ignore"):  # a ratio past float64's range is inf on both paths
        array._add_array(np.array([residual]), bound, (4, 2), ("k", 2), 0, {"x": 1})
    assert json.dumps(to_jsonable(one.to_dict()), sort_keys=True) == json.dumps(to_jsonable(array.to_dict()), sort_keys=True)
    assert one.worst == array.worst and one._ratio_pool == array._ratio_pool and one._quantile_pool == array._quantile_pool
