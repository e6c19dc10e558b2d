"""The supervisor's restart policy, without processes."""

from __future__ import annotations

import pytest

from kascade.dataflow.restarts import RestartPolicy, WorkerFailed
from kascade.schemas.cluster import RestartSettings

SETTINGS = RestartSettings(limit=4, backoff_s=1, backoff_max_s=5, healthy_after_s=60)


def test_the_wait_doubles_up_to_its_cap_and_the_job_gives_up_after_the_limit() -> None:
    policy = RestartPolicy(SETTINGS)
    waits = [policy.after_failure("boom", fatal=False, ran_s=2) for _ in range(4)]
    assert waits == [1, 2, 4, 5]
    with pytest.raises(WorkerFailed, match=r"^boom \(gave up after 4 restarts\)$"):
        policy.after_failure("boom", fatal=False, ran_s=2)


def test_a_start_that_ran_healthy_resets_the_count_and_the_wait() -> None:
    policy = RestartPolicy(SETTINGS)
    for _ in range(4):
        policy.after_failure("boom", fatal=False, ran_s=2)
    assert policy.after_failure("boom", fatal=False, ran_s=60) == 1
    assert policy.restarts == 1


@pytest.mark.parametrize(
    ("policy", "fatal", "stopping"),
    [
        (RestartPolicy(SETTINGS), True, False),  # a restart would fail alike
        (RestartPolicy(SETTINGS), False, True),  # the job is draining
        (RestartPolicy(SETTINGS, recoverable=False), False, False),  # nothing to resume
        (RestartPolicy(RestartSettings(limit=0)), False, False),  # never restart
    ],
)
def test_some_failures_are_never_restarted_and_keep_their_cause(
    policy: RestartPolicy, fatal: bool, stopping: bool
) -> None:
    with pytest.raises(WorkerFailed, match=r"^worker 1: bad settings"):
        policy.after_failure("worker 1: bad settings", fatal=fatal, ran_s=1, stopping=stopping)
    assert policy.restarts == 0
