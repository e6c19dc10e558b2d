"""The ``kascade`` command line, over the streaming runtime and the offline toolchain.

The runtime's commands (``run``, ``topics``) live in :mod:`kascade.dataflow.commands`,
the toolchain's (``train``, ``export``, ``quantize``, ``calibrate``, ``evaluate``) in
:mod:`kascade.toolchain.commands`, which imports torch only when one of them runs; the
demo (:mod:`kascade.demo`) uses both. Misuse gets one line on stderr and exit status 2;
any :class:`~kascade.errors.KascadeError` (bad settings, unreachable Kafka, a model
directory that does not match its manifest, ...) one line and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from kascade import __version__, demo
from kascade.dataflow import commands as runtime
from kascade.errors import KascadeError, kascade_error_in
from kascade.toolchain import commands as toolchain

# Modules only the [export] extra installs; importing one is how a toolchain command
# finds out it is missing.
TOOLCHAIN_MODULES = ("torch", "transformers", "sklearn", "scipy", "onnx", "onnxscript")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kascade", description="Classify a live Kafka text stream on ordinary CPUs."
    )
    parser.add_argument("--version", action="version", version=f"kascade {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    runtime.register(sub)
    demo.register(sub)
    toolchain.register(sub)
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # librdkafka reports transient conditions (retries, config hints) as warnings.
    logging.getLogger("kascade.rdkafka").setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        # onnxruntime's quantizer logs advice (opset upgrades, pre-processing) on every
        # call, partly through the root logger; the toolchain validates its output itself.
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda r: "onnxruntime" not in r.pathname)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(
        runtime.expand_short_flags(list(sys.argv[1:] if argv is None else argv))
    )
    _configure_logging(args.verbose)
    try:
        return int(args.func(args))
    except KascadeError as e:
        print(f"kascade: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] in TOOLCHAIN_MODULES:
            print(
                f"kascade: {args.command} needs the model toolchain ({e.name} is not"
                " installed): pip install 'kascade[export]'",
                file=sys.stderr,
            )
            return 1
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        cause = kascade_error_in(e)  # e.g. a sink's error, wrapped by Bytewax
        if cause is None:
            raise
        print(f"kascade: {cause}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
