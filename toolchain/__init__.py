"""The offline model toolchain: train, export (+ parity), quantize (+ budgeted search), evaluate.

The only part of kascade that imports torch and transformers; install it with the
``[export]`` extra. The runtime (``operators``, ``dataflow``) only reads what it writes.
"""

from kascade.errors import KascadeError


class ToolchainError(KascadeError):
    """A problem with the user's input (checkpoint, data, paths): printed as one line."""
