"""kascade: classify a live Kafka text stream on ordinary CPUs.

One import package in four parts, layered so that a runtime install never loads the
offline toolchain:

- ``kascade.schemas``: records that cross Kafka, settings, model-directory contracts;
- ``kascade.operators`` and ``kascade.dataflow``: the streaming runtime;
- ``kascade.toolchain``: the offline model toolchain (torch, transformers; ``[export]``);
- ``kascade.cli`` and ``kascade.demo``: the command line over both halves.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kascade")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0.0.0"
