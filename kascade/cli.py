"""The ``kascade`` command line, over the streaming runtime and the offline toolchain.

The runtime's commands (``run``, ``topics``) live in :mod:`kascade.dataflow.commands`,
the toolchain's (``train``, ``export``, ``quantize``, ``calibrate``, ``evaluate``) in
:mod:`kascade.toolchain.commands`, which imports torch only when one of them runs; the
demo (:mod:`kascade.demo`) uses both. Every failure kascade expects is one line on
stderr: exit status 2 for misuse (a flag, a value, a setting, a file given that cannot
work: :class:`~kascade.errors.UsageError`), 1 for a failure of the world (unreachable
Kafka, a model directory that does not match its manifest, a worker that died: any
other :class:`~kascade.errors.KascadeError`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from kascade import __version__, demo, logs
from kascade.dataflow import commands as runtime
from kascade.errors import KascadeError, UsageError, kascade_error_in
from kascade.logs import FORMATS, LEVELS, Level, LogConfig
from kascade.toolchain import commands as toolchain

# Modules only the [export] extra installs; importing one is how a toolchain command
# finds out it is missing.
TOOLCHAIN_MODULES = (
    "torch",
    "transformers",
    "sklearn",
    "scipy",
    "onnx",
    "onnxscript",
    "datasketch",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _log_flags(p: argparse.ArgumentParser, *, default: object) -> None:
    """The logging flags, on the top-level parser and (defaulting to SUPPRESS, so they do
    not undo what was given before the command) on every command's."""
    p.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="= --log-level info"
    )
    p.add_argument(
        "--log-level", choices=LEVELS, default=default, help="what to log (default: warning)"
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default,
        help="text lines, or one JSON object per line for log shippers (default: text)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kascade",
        description="Classify a live Kafka text stream on ordinary CPUs.",
        epilog="Commands marked [export] need the model toolchain: pip install 'kascade[export]'.",
    )
    parser.add_argument("--version", action="version", version=f"kascade {__version__}")
    _log_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    runtime.register(sub)
    demo.register(sub)
    toolchain.register(sub)
    for command in sub.choices.values():
        _log_flags(command, default=argparse.SUPPRESS)
    return parser


def log_config(args: argparse.Namespace) -> LogConfig:
    """``--log-level`` wins over ``-v``; either may come before or after the command.

    >>> log_config(build_parser().parse_args(["topics", "-v"]))
    LogConfig(level='info', format='text')
    """
    level: Level = args.log_level or ("info" if args.verbose else "warning")
    return LogConfig(level=level, format=args.log_format or "text")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(
        runtime.expand_short_flags(list(sys.argv[1:] if argv is None else argv))
    )
    logs.configure(log_config(args))
    try:
        return int(args.func(args))
    except KascadeError as e:
        return _fail(e)
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
        return _fail(cause)


def _fail(e: KascadeError) -> int:
    print(f"kascade: {e}", file=sys.stderr)
    return 2 if isinstance(e, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
