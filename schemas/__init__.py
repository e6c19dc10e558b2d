"""Message and configuration contracts of kascade.

The typed records here are the single source of the JSON Schemas in ``schemas/json``;
``python -m schemas.export`` rewrites those files and a test keeps them in step.
This package imports nothing else of the project.
"""

from schemas.records import (
    Aggregation,
    ChunkCounts,
    DeadLetter,
    DeadLetterReason,
    InputDocument,
    ModelIdentity,
    OutputRecord,
    SourcePosition,
)

__all__ = [
    "Aggregation",
    "ChunkCounts",
    "DeadLetter",
    "DeadLetterReason",
    "InputDocument",
    "ModelIdentity",
    "OutputRecord",
    "SourcePosition",
]
