"""How a record, a setting or a file that fails validation is said: in one line.

>>> from pydantic import BaseModel, Field, ValidationError
>>> class Point(BaseModel):
...     x: int = Field(ge=0)
>>> try:
...     Point(x=-1)
... except ValidationError as e:
...     first_problem(e)
'x: Input should be greater than or equal to 0'
"""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(e: ValidationError) -> str:
    """The first problem pydantic found, as ``where: what`` (a validator's own message
    without the ``Value error, `` pydantic puts in front of it)."""
    first = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
