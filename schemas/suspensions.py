"""The scopes the live test suspended, kept in the recovery directory.

A violation is a fact about a calibration and a stream, not about the process that saw
it: a worker restarted after it must not settle chunks again on the stream that just
failed the test, and the other worker processes of the job must stop settling that
scope too. The process where the job's test fires adds the scope to
``suspensions.json``; every process reads the file at start and while it runs. A
suspension ends only when another calibration (another ``cascade.json`` sha256) is in
force.

>>> s = Suspensions().with_scope("ab" * 32, "sw", "7.9% of 151 audits")
>>> s.scopes("ab" * 32), s.scopes("cd" * 32)
({'sw'}, set())
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kascade.schemas.cascade import LENGTHS
from kascade.schemas.files import write_text_atomically
from kascade.schemas.records import LANGUAGE_TAG

SUSPENSIONS_FILE = "suspensions.json"
# The scope of a violation of the certified document stop: the stop itself, for every
# document (no language tag has an underscore, so it is never a language's).
STOP = "doc_stop"
# What a suspension covers: a language ("all" and "other" have a tag's shape), a length of
# document alone or in a language ("long", "de/long"), or the document stop.
SCOPE = rf"^(({LANGUAGE_TAG.strip('^$')})(/({'|'.join(LENGTHS)}))?|{STOP})$"


class Suspension(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cascade_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    scope: str = Field(
        pattern=SCOPE,
        description="'all', 'other', a language the test followed (with a length of"
        " document, where its stratum was certified for one), or 'doc_stop'",
    )
    evidence: str = Field(description="what the test saw when it fired")
    at_ms: int = Field(description="when, in milliseconds since the epoch")
    named: list[str] = Field(
        default_factory=list,
        description="for scope 'other': the languages tested on their own when it fired,"
        " which it does not cover (empty: it covers every language)",
    )


class Suspensions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    suspended: list[Suspension] = Field(default_factory=list)

    def scopes(self, cascade_sha256: str) -> set[str]:
        """What stays suspended while the calibration ``cascade_sha256`` is in force."""
        return {s.scope for s in self.suspended if s.cascade_sha256 == cascade_sha256}

    def with_scope(
        self, cascade_sha256: str, scope: str, evidence: str, named: Iterable[str] = ()
    ) -> Suspensions:
        if scope in self.scopes(cascade_sha256):
            return self
        entry = Suspension(
            cascade_sha256=cascade_sha256,
            scope=scope,
            evidence=evidence,
            at_ms=int(time.time() * 1000),
            named=sorted(named),
        )
        return Suspensions(suspended=[*self.suspended, entry])


def load(recovery_dir: Path) -> Suspensions:
    path = recovery_dir / SUSPENSIONS_FILE
    if not path.is_file():
        return Suspensions()
    return Suspensions.model_validate_json(path.read_bytes())


def add(
    recovery_dir: Path, cascade_sha256: str, scope: str, evidence: str, named: Iterable[str] = ()
) -> Suspensions:
    """Add a scope to the file, under a lock: processes of one job may add at once."""
    with _locked(recovery_dir):
        now = load(recovery_dir).with_scope(cascade_sha256, scope, evidence, named)
        write_text_atomically(recovery_dir / SUSPENSIONS_FILE, now.model_dump_json(indent=2))
    return now


@contextlib.contextmanager
def _locked(recovery_dir: Path) -> Iterator[None]:
    recovery_dir.mkdir(parents=True, exist_ok=True)
    with open(recovery_dir / f".{SUSPENSIONS_FILE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
