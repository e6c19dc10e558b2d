"""The records that killed worker processes, kept in the recovery directory.

The supervisor of ``kascade run --recovery-dir`` writes ``quarantine.json`` when a
worker process dies while handling a record (see :mod:`kascade.operators.inflight`);
restarted workers dead-letter a record once it has killed ``restarts.quarantine_after``
processes, instead of dying on it again.

>>> pos = SourcePosition(topic="in", partition=0, offset=41)
>>> q = Quarantine().with_death(pos, "full_model").with_death(pos, "full_model")
>>> q.condemned(after=2)[("in", 0, 41)]
'2 worker processes died at stage full_model on this record'
>>> q.condemned(after=3)
{}
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kascade.schemas.files import write_text_atomically
from kascade.schemas.records import SourcePosition

QUARANTINE_FILE = "quarantine.json"

Coordinates = tuple[str, int, int]


class Suspect(BaseModel):
    """A record a worker process was inside a step with, and that step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: SourcePosition
    stage: str


class Deaths(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: SourcePosition
    stage: str
    deaths: int = Field(ge=1)


class Quarantine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    records: list[Deaths] = Field(default_factory=list)

    @classmethod
    def load(cls, recovery_dir: Path) -> Quarantine:
        path = recovery_dir / QUARANTINE_FILE
        if not path.is_file():
            return cls()
        return cls.model_validate_json(path.read_bytes())

    def save(self, recovery_dir: Path) -> None:
        write_text_atomically(recovery_dir / QUARANTINE_FILE, self.model_dump_json(indent=2))

    def with_death(self, source: SourcePosition, stage: str) -> Quarantine:
        others = [r for r in self.records if r.source != source]
        before = next((r.deaths for r in self.records if r.source == source), 0)
        return Quarantine(records=[*others, Deaths(source=source, stage=stage, deaths=before + 1)])

    def deaths(self, source: SourcePosition) -> int:
        return next((r.deaths for r in self.records if r.source == source), 0)

    def condemned(self, *, after: int) -> dict[Coordinates, str]:
        """Records to dead-letter on sight, by (topic, partition, offset), with why."""
        return {
            (r.source.topic, r.source.partition, r.source.offset): (
                f"{r.deaths} worker processes died at stage {r.stage} on this record"
            )
            for r in self.records
            if r.deaths >= after
        }
