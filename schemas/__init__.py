"""Message and configuration contracts of kascade.

The typed records here are the single source of the JSON Schemas in ``schemas/json``;
``python -m kascade.schemas.export`` rewrites those files and a test keeps them in step.
This package imports nothing of the project but the base in ``kascade/`` (its errors).
"""

from kascade.schemas.dead_letters import DeadLetter, DeadLetterReason, Header, KafkaHeaders
from kascade.schemas.records import (
    Aggregation,
    CascadeUse,
    ChunkCounts,
    Enrichment,
    InputDocument,
    ModelIdentity,
    OutputRecord,
    Reading,
    SourcePosition,
    Stage,
    StopReason,
)

__all__ = [
    "Aggregation",
    "CascadeUse",
    "ChunkCounts",
    "DeadLetter",
    "DeadLetterReason",
    "Enrichment",
    "Header",
    "InputDocument",
    "KafkaHeaders",
    "ModelIdentity",
    "OutputRecord",
    "Reading",
    "SourcePosition",
    "Stage",
    "StopReason",
]
