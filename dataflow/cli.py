"""The ``kascade`` command line.

Misuse gets one line on stderr and exit status 2; a run that cannot start (Kafka
unreachable, bad settings) gets one line and exit status 1.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from dataflow.kafka_io import KafkaUnavailable
from schemas.manifest import ManifestMismatch
from toolchain import ToolchainError
from toolchain.cli import needs_torch_message


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


def _run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    flat = {
        "model_dir": args.model_dir,
        "workers": args.workers,
        "aggregation": args.aggregation,
        "recovery_dir": args.recovery_dir,
        "snapshot_interval_s": args.snapshot_interval,
        "metrics_port": args.metrics_port,
    }
    out: dict[str, Any] = {k: v for k, v in flat.items() if v is not None}
    sections = {
        "chunking": {"max_tokens": args.chunk_tokens, "overlap": args.overlap},
        "encoder": {"threads": args.threads, "micro_batch": args.micro_batch},
        "cascade": {"mode": args.cascade, "audit_fraction": args.audit_fraction},
    }
    for name, values in sections.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:  # only what was given, so the file's and env's other keys survive
            out[name] = given
    return out


def _settings(
    args: argparse.Namespace, *, extra: dict[str, Any] | None = None, **kafka_extra: Any
) -> Any:
    from schemas.settings import load_settings

    kafka = _kafka_overrides(args) | kafka_extra
    overrides = dict(extra or {})
    if kafka:
        overrides["kafka"] = kafka
    try:
        return load_settings(args.config, **overrides)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"invalid settings: {where}: {first['msg']}") from None
    except (FileNotFoundError, OSError) as e:
        raise CliError(str(e)) from None


def _cmd_run(args: argparse.Namespace) -> int:
    from dataflow.flow import build_flow
    from dataflow.runner import run

    settings = _settings(
        args, extra=_run_overrides(args), **({"tail": False} if args.bounded else {})
    )
    if settings.model_dir is None:
        raise CliError(
            "no model: pass --model-dir DIR (or KASCADE_MODEL_DIR, or model_dir in --config)"
        )
    from operators.encoder import load_model_dir

    model = load_model_dir(settings.model_dir)  # a bad model fails before Kafka is touched
    if settings.chunking.max_tokens > model.manifest.max_length:
        raise CliError(
            f"chunk size {settings.chunking.max_tokens} exceeds the model's maximum length"
            f" {model.manifest.max_length}"
        )
    from dataflow.flow import use_cascade
    from operators.cascade import Cascade

    try:
        if use_cascade(settings, model):  # a stale or missing cascade.json fails here, too
            Cascade.load(model.directory, model.manifest_sha256, settings.cascade.operating_point)
    except (ValueError, FileNotFoundError) as e:
        raise CliError(str(e)) from None
    if (args.addresses is None) != (args.process_id is None):
        raise CliError("--addresses and --process-id go together")
    # The model verified above goes to the flow (and to worker processes) as it is, so its
    # files are hashed once per run, not once more per process.
    build = functools.partial(build_flow, model=model)
    if args.addresses is None:
        return run(settings, build)
    addresses = [a for a in args.addresses.split(";") if a]
    if not 0 <= args.process_id < len(addresses):
        raise CliError(f"--process-id must be in 0..{len(addresses) - 1}")
    if settings.workers != 1:
        raise CliError("with --addresses each host runs one worker process; drop --workers")
    return run(settings, build, process_id=args.process_id, addresses=addresses)


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

    return demo(
        brokers=args.brokers, port=args.port, keep_broker=args.keep_broker, model_dir=args.model_dir
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kascade", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="run the streaming job")
    _kafka_flags(p)
    p.add_argument(
        "--bounded", action="store_true", help="stop at the end of the input instead of tailing"
    )
    g = p.add_argument_group("job")
    g.add_argument("--model-dir", type=Path, help="model directory (kascade export/quantize)")
    g.add_argument("--workers", type=int, help="worker processes on this host (default 1)")
    g.add_argument("--threads", type=int, help="ONNX Runtime threads per worker (default 1)")
    g.add_argument("--micro-batch", type=int, help="chunks per model call (default 1)")
    g.add_argument("--chunk-tokens", type=int, help="tokens per chunk (default 256)")
    g.add_argument("--overlap", type=int, help="tokens shared by neighbouring chunks (default 32)")
    g.add_argument("--aggregation", choices=["token_mean", "max", "majority"])
    g.add_argument(
        "--cascade",
        choices=["auto", "on", "off"],
        help="cheap stages before the full model (auto: if calibrated)",
    )
    g.add_argument("--audit-fraction", type=float, help="settled chunks re-checked (default 0.01)")
    g.add_argument("--recovery-dir", type=Path, help="enable crash recovery (Bytewax snapshots)")
    g.add_argument("--snapshot-interval", type=float, help="seconds between snapshots (default 5)")
    g.add_argument("--metrics-port", type=int, help="Prometheus port (process i uses port + i)")
    g.add_argument("--addresses", help='several hosts: "host:port;host:port;..." (same on all)')
    g.add_argument("--process-id", type=int, help="this host's index in --addresses")
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
    p.add_argument("--model-dir", type=Path, help="model directory (default: build the demo model)")
    p.set_defaults(func=_cmd_demo)

    from toolchain.cli import register

    register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # librdkafka reports transient conditions (retries, config hints) as warnings.
    logging.getLogger("kascade.rdkafka").setLevel(logging.INFO if args.verbose else logging.ERROR)
    if not args.verbose:
        # onnxruntime's quantizer logs advice (opset upgrades, pre-processing) on every
        # call, partly through the root logger; the toolchain validates its output itself.
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda r: "onnxruntime" not in r.pathname)
    try:
        return int(args.func(args))
    except (CliError, KafkaUnavailable, ToolchainError, ManifestMismatch) as e:
        print(f"kascade: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        if e.name in ("torch", "transformers", "sklearn", "onnxscript", "tqdm"):
            print(f"kascade: {needs_torch_message(e)}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
