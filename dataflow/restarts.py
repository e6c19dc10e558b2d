"""When the supervisor starts failed worker processes again: a pure policy, so its rules
are tested without processes.

A failure is restarted after a wait that doubles up to a cap; a start that ran healthy
for long enough resets the count and the wait. Never restarted: a fatal failure (bad
settings, broker or model: a restart would fail alike), a job without a recovery
directory (a restart could not resume), a job that is stopping, or one that failed
``limit`` times in a row.

>>> from kascade.schemas.cluster import RestartSettings
>>> policy = RestartPolicy(RestartSettings(limit=2, backoff_s=1, backoff_max_s=1.5))
>>> [policy.after_failure("worker 0 died", fatal=False, ran_s=1) for _ in range(2)]
[1.0, 1.5]
>>> policy.after_failure("worker 0 died", fatal=False, ran_s=1)
Traceback (most recent call last):
...
kascade.dataflow.restarts.WorkerFailed: worker 0 died (gave up after 2 restarts)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kascade.errors import KascadeError
from kascade.schemas.cluster import RestartSettings


class WorkerFailed(KascadeError):
    """A worker process stopped with an error; the message is the first failure's."""


@dataclass
class RestartPolicy:
    settings: RestartSettings
    recoverable: bool = True  # a recovery directory: a restart resumes from the snapshot
    restarts: int = 0  # in a row, so far
    _wait_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._wait_s = self.settings.backoff_s

    def after_failure(
        self, cause: str, *, fatal: bool, ran_s: float, stopping: bool = False
    ) -> float:
        """Seconds to wait before the next start after a start that ran ``ran_s`` and
        failed with ``cause``; raises :class:`WorkerFailed` when there is no next start."""
        if ran_s >= self.settings.healthy_after_s:
            self.restarts, self._wait_s = 0, self.settings.backoff_s
        if not self.recoverable or fatal or stopping:
            raise WorkerFailed(cause)
        if self.restarts >= self.settings.limit:
            raise WorkerFailed(f"{cause} (gave up after {self.restarts} restarts)")
        self.restarts += 1
        wait, self._wait_s = self._wait_s, min(self._wait_s * 2, self.settings.backoff_max_s)
        return wait
