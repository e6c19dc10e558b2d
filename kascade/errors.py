"""The root of kascade's own errors.

Everything kascade raises on purpose derives from :class:`KascadeError`: a problem the
user can fix (a setting, a path, a broker, a model directory), whose message is one
line. The command line catches this base, prints the message and exits non-zero; any
other exception is a bug and keeps its traceback.
"""


class KascadeError(Exception):
    """A problem the user can fix; ``str(error)`` is one line that says what and where."""


def kascade_error_in(e: BaseException) -> KascadeError | None:
    """The :class:`KascadeError` behind ``e``, if any: Bytewax wraps an operator's
    exception in its own runtime errors, chained by ``__cause__``.

    >>> try:
    ...     try:
    ...         raise KascadeError("Kafka unreachable")
    ...     except KascadeError as inner:
    ...         raise RuntimeError("error in step") from inner
    ... except RuntimeError as outer:
    ...     str(kascade_error_in(outer))
    'Kafka unreachable'
    """
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        if isinstance(current, KascadeError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class UsageError(KascadeError):
    """The command line or settings were given something that cannot work."""
