"""One start of the worker processes, as the supervisor's state machine sees it: no
processes, only what it would see and what it orders."""

from __future__ import annotations

from kascade.dataflow.lifecycle import OneStart, Order, Phase, Seen

BOTH = frozenset({0, 1})
NONE: frozenset[int] = frozenset()


def start(notice_s: float | None = None) -> OneStart:
    return OneStart(ids=BOTH, connect_timeout_s=10, drain_s=5, notice_s=notice_s)


def test_a_start_forms_runs_and_finishes_when_every_process_exits_cleanly() -> None:
    s = start()
    assert s.step(Seen(0.2, alive=BOTH, joined=frozenset({1}))) == []
    assert s.phase == Phase.FORMING
    assert s.step(Seen(0.4, alive=BOTH, joined=BOTH)) == []
    assert s.phase == Phase.RUNNING
    assert s.step(Seen(9.0, alive=frozenset({0}), joined=BOTH)) == []
    assert s.step(Seen(9.2, alive=NONE, joined=BOTH)) == []
    assert s.phase == Phase.FINISHED and s.phase.ended and s.failed == ()


def test_a_process_that_fails_unasked_ends_the_start_and_terminates_the_others() -> None:
    s = start()
    s.step(Seen(0.2, alive=BOTH, joined=BOTH))
    assert s.step(Seen(3.0, alive=frozenset({1}), joined=BOTH, failed=(0,))) == [Order.TERMINATE]
    assert s.phase == Phase.FAILED
    # the ones terminated afterwards are not taken for the cause
    assert s.failed == (0,)
    assert s.step(Seen(3.2, alive=NONE, joined=BOTH, failed=(0, 1))) == []
    assert s.failed == (0,)


def test_a_cluster_that_does_not_form_in_time_is_killed() -> None:
    s = start()
    assert s.step(Seen(9.9, alive=BOTH, joined=frozenset({0}))) == []
    assert s.step(Seen(10.1, alive=BOTH, joined=frozenset({0}))) == [Order.KILL]
    assert s.phase == Phase.NOT_FORMED


def test_whom_the_cluster_waits_for_is_said_once_after_the_notice_time() -> None:
    s = start(notice_s=3)
    said = [s.step(Seen(t, alive=BOTH, joined=NONE)) for t in (1.0, 3.1, 3.3, 6.0)]
    assert said == [[], [Order.SAY_WAITING], [], []]
    assert start().step(Seen(9.0, alive=BOTH, joined=NONE)) == []  # no peers, no notice


def test_a_stop_drains_kills_those_not_yet_joined_and_gives_up_after_the_drain_time() -> None:
    s = start()
    assert s.step(Seen(1.0, alive=BOTH, joined=frozenset({0}), stopping=True)) == [
        Order.KILL_UNJOINED
    ]
    assert s.phase == Phase.DRAINING
    # one killed while draining is not a failure that terminates the rest
    assert (
        s.step(Seen(2.0, alive=frozenset({0}), joined=frozenset({0}), failed=(1,), stopping=True))
        == []
    )
    assert s.step(Seen(6.5, alive=frozenset({0}), joined=frozenset({0}), stopping=True)) == [
        Order.KILL
    ]
    assert s.phase == Phase.NOT_DRAINED


def test_a_drained_start_whose_processes_exit_cleanly_finishes() -> None:
    s = start()
    s.step(Seen(0.5, alive=BOTH, joined=BOTH))
    assert s.step(Seen(1.0, alive=BOTH, joined=BOTH, stopping=True)) == []
    assert s.step(Seen(2.0, alive=NONE, joined=BOTH, stopping=True)) == []
    assert s.phase == Phase.FINISHED


def test_a_new_plan_is_taken_up_once_every_process_joined_and_interrupts_them_once() -> None:
    s = start()
    assert s.step(Seen(0.2, alive=BOTH, joined=frozenset({0}), new_plan=True)) == []
    assert s.phase == Phase.FORMING
    assert s.step(Seen(0.4, alive=BOTH, joined=BOTH, new_plan=True)) == [Order.INTERRUPT]
    assert s.phase == Phase.RELOADING
    assert s.step(Seen(0.6, alive=BOTH, joined=BOTH, new_plan=True)) == []
    assert s.step(Seen(1.0, alive=NONE, joined=BOTH, new_plan=True)) == []
    assert s.phase == Phase.FINISHED


def test_a_process_failing_while_the_others_reload_fails_the_start() -> None:
    s = start()
    s.step(Seen(0.4, alive=BOTH, joined=BOTH, new_plan=True))
    assert s.step(Seen(0.8, alive=frozenset({1}), joined=BOTH, failed=(0,), new_plan=True)) == [
        Order.TERMINATE
    ]
    assert s.phase == Phase.FAILED


def test_an_ended_start_orders_nothing_more() -> None:
    s = start()
    s.step(Seen(10.5, alive=BOTH, joined=NONE))
    assert s.phase == Phase.NOT_FORMED
    assert s.step(Seen(11.0, alive=BOTH, joined=NONE, failed=(0,))) == []
    assert s.phase == Phase.NOT_FORMED
