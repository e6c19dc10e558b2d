"""The root of kascade's own errors.

Everything kascade raises on purpose derives from :class:`KascadeError`: a problem the
user can fix (a setting, a path, a broker, a model directory), whose message is one
line. The command line catches this base, prints the message and exits non-zero; any
other exception is a bug and keeps its traceback.
"""


class KascadeError(Exception):
    """A problem the user can fix; ``str(error)`` is one line that says what and where."""


class UsageError(KascadeError):
    """The command line or settings were given something that cannot work."""
