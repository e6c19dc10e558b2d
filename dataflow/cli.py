"""The ``kascade`` command line.

Misuse gets one line on stderr and exit status 2; a run that cannot start (Kafka
unreachable, bad settings) gets one line and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from dataflow.kafka_io import KafkaUnavailable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class CliError(Exception):
    """A problem the user can fix; printed as one line."""


def _kafka_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kafka")
    g.add_argument("--brokers", help="bootstrap servers, host:port[,host:port]")
    g.add_argument("--input-topic")
    g.add_argument("--output-topic")
    g.add_argument("--dead-letter-topic")
    g.add_argument("--config", type=Path, help="TOML settings file (flags and env win)")


def _kafka_overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = {
        "brokers": args.brokers,
        "input_topic": args.input_topic,
        "output_topic": args.output_topic,
        "dead_letter_topic": args.dead_letter_topic,
    }
    return {k: v for k, v in names.items() if v is not None}


def _settings(args: argparse.Namespace, **kafka_extra: Any) -> Any:
    from schemas.settings import load_settings

    kafka = _kafka_overrides(args) | kafka_extra
    try:
        return load_settings(args.config, kafka=kafka) if kafka else load_settings(args.config)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"invalid settings: {where}: {first['msg']}") from None
    except (FileNotFoundError, OSError) as e:
        raise CliError(str(e)) from None


def _cmd_run(args: argparse.Namespace) -> int:
    from dataflow.flow import build_passthrough_flow
    from dataflow.runner import run

    settings = _settings(args, **({"tail": False} if args.bounded else {}))
    run(settings, build_passthrough_flow)
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from dataflow.kafka_io import create_topics
    from dataflow.runner import required_topics

    settings = _settings(args)
    wanted = dict.fromkeys(required_topics(settings), args.partitions)
    created = create_topics(settings.kafka, wanted)
    for t in wanted:
        print(f"{t}: {'created' if t in created else 'exists'}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from dataflow.demo import demo

    return demo(brokers=args.brokers, port=args.port, keep_broker=args.keep_broker)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kascade", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="run the streaming job")
    _kafka_flags(p)
    p.add_argument(
        "--bounded", action="store_true", help="stop at the end of the input instead of tailing"
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("topics", help="create the input, output and dead-letter topics")
    _kafka_flags(p)
    p.add_argument("--partitions", type=int, default=2)
    p.set_defaults(func=_cmd_topics)

    p = sub.add_parser(
        "demo", help="local broker + sample documents through the job, printed as a table"
    )
    p.add_argument("--brokers", help="use this cluster instead of starting a local broker")
    p.add_argument("--port", type=int, default=9092, help="local broker port")
    p.add_argument("--keep-broker", action="store_true", help="leave the local broker running")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # librdkafka reports transient conditions (retries, config hints) as warnings.
    logging.getLogger("kascade.rdkafka").setLevel(logging.INFO if args.verbose else logging.ERROR)
    try:
        return int(args.func(args))
    except (CliError, KafkaUnavailable) as e:
        print(f"kascade: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
