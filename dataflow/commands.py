"""``kascade run``, ``kascade topics`` and ``kascade sample``: the streaming runtime's commands.

Their flags are generated from :class:`~kascade.schemas.settings.Settings` (one flag per
setting, ``--kafka.brokers``, ``--chunking.max-tokens``, ...); the few written here are
about the command itself, not settings.
"""

from __future__ import annotations

import argparse
import functools
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from kascade.arguments import at_most, positive
from kascade.errors import UsageError
from kascade.schemas.settings import (
    Settings,
    add_settings_flags,
    load_settings,
    settings_error,
)

# Short forms of the most used settings, so everyday command lines stay short.
SHORT_FLAGS = {
    "--brokers": "--kafka.brokers",
    "--input-topic": "--kafka.input-topic",
    "--output-topic": "--kafka.output-topic",
    "--dead-letter-topic": "--kafka.dead-letter-topic",
    "--chunk-tokens": "--chunking.max-tokens",
    "--overlap": "--chunking.overlap",
    "--threads": "--encoder.threads",
    "--cascade": "--cascade.mode",
}


COMMANDS = ("run", "topics", "sample")
# The settings each command reads (run: all). Sampling reads records as run does: where
# they are, how they are encoded, which are too large.
SAMPLE_SETTINGS = ("kafka", "input", "registry", "max_text_bytes")
TOPICS_SETTINGS = ("kafka",)


def expand_short_flags(argv: list[str]) -> list[str]:
    """``argv`` with the short forms spelled out (``--brokers=x`` too), for this
    module's commands only (a toolchain command's ``--threads`` is its own).

    >>> expand_short_flags(["run", "--brokers", "k:9092", "--overlap=8"])
    ['run', '--kafka.brokers', 'k:9092', '--chunking.overlap=8']
    >>> expand_short_flags(["--log-format", "json", "run", "--brokers", "k:9092"])
    ['--log-format', 'json', 'run', '--kafka.brokers', 'k:9092']
    >>> expand_short_flags(["train", "--threads", "2"])
    ['train', '--threads', '2']
    """
    if _command_in(argv) not in COMMANDS:
        return argv
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        out.append(SHORT_FLAGS.get(name, name) + eq + value)
    return out


def _command_in(argv: list[str]) -> str | None:
    """The command named in ``argv``, past the top-level flags and their values.

    >>> _command_in(["--log-format", "json", "-v", "run", "--brokers", "k:9092"])
    'run'
    """
    args = iter(argv)
    for arg in args:
        if arg in ("--log-level", "--log-format"):
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _short_forms_epilog(sections: tuple[str, ...] | None = None) -> str:
    forms = [
        f"{short} = {long}"
        for short, long in SHORT_FLAGS.items()
        if sections is None or long.removeprefix("--").split(".")[0] in sections
    ]
    return "short forms: " + ", ".join(forms)


def settings_of(args: argparse.Namespace, **overrides: Any) -> Settings:
    """The run's settings: generated flags > ``overrides`` > env > ``--config`` > defaults."""
    try:
        return load_settings(args.config, flags=args.settings_flags(parsed_args=args), **overrides)
    except ValidationError as e:
        raise settings_error(e) from None
    except OSError as e:
        raise UsageError(str(e)) from None
    except SettingsError as e:  # a flag's value its type cannot parse (KEY=VALUE lists)
        raise UsageError(f"invalid settings: {e} (see --help for the flag's form)") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{args.config}: not valid TOML: {e}") from None


def _cmd_run(args: argparse.Namespace) -> int:
    from kascade.dataflow.flow import build_flow, prepare
    from kascade.dataflow.plans import NewPlan
    from kascade.dataflow.recalibration import Recalibration
    from kascade.dataflow.runner import run

    settings = settings_of(args, **({"kafka": {"tail": False}} if args.bounded else {}))
    prepared = prepare(settings)  # a bad model or cascade fails before Kafka is touched
    # What was verified above goes to the flow (and to worker processes) as it is: the
    # model's files are hashed and the cascade checked once per job, not once per process.
    build = functools.partial(build_flow, prepared=prepared)
    recalibration = Recalibration(settings, prepared)

    def replan() -> NewPlan | None:
        new = recalibration.new()
        if new is None or new.in_force is None or new.in_force.sha256 is None:
            return None
        return NewPlan(functools.partial(build_flow, prepared=new), new.in_force.sha256)

    return run(
        settings,
        build,
        describe=prepared.describe(settings),
        replan=replan,
        calibration=recalibration.in_force,
    )


def _cmd_topics(args: argparse.Namespace) -> int:
    from kascade.dataflow.broker import create_topics
    from kascade.dataflow.runner import required_topics

    settings = settings_of(args)
    wanted = dict.fromkeys(required_topics(settings), args.partitions)
    created = create_topics(settings.kafka, wanted)
    for t in wanted:
        print(f"{t}: {'created' if t in created else 'exists'}")
    return 0


# The most texts one sample writes: calibration certifies on thousands, and the places of
# a million candidates cost ~200 MB in sample's first pass.
SAMPLE_MAX_COUNT = 1_000_000


def _cmd_sample(args: argparse.Namespace) -> int:
    from kascade.dataflow.sample import sample

    settings = settings_of(args)
    got = sample(settings, args.count, args.out)
    langs = ", ".join(f"{lang} {n}" for lang, n in sorted(got.by_language.items()))
    parts = ", ".join(f"{p}: {n}" for p, n in sorted(got.by_partition.items()))
    skipped = sum(got.skipped.values())
    print(
        f"wrote {got.taken} texts to {args.out} (partitions {parts}"
        + (f"; languages {langs}" if langs else "")
        + f"; {skipped} of {got.read} records read skipped as dead letters"
        + (f", {got.blank} as blank" if got.blank else "")
        + ")"
    )
    return 0


def _with_settings(p: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """``--config`` and the flags of the settings in ``sections`` (all when None): a
    command offers only the settings it reads."""
    p.add_argument(
        "--config", type=Path, help="TOML settings file; flags and the environment win over it"
    )
    p.set_defaults(settings_flags=add_settings_flags(p, sections))


def register(sub: argparse._SubParsersAction) -> None:
    """Add the runtime's subcommands to the ``kascade`` parser."""
    p = sub.add_parser("run", help="run the streaming job", epilog=_short_forms_epilog())
    p.add_argument(
        "--bounded",
        action="store_true",
        help="stop at the end of the input instead of tailing (= --no-kafka.tail)",
    )
    _with_settings(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "sample",
        help="draw calibration text from the input topic, read as kascade run reads it",
        epilog=_short_forms_epilog(SAMPLE_SETTINGS),
    )
    p.add_argument(
        "--count",
        type=at_most(SAMPLE_MAX_COUNT),
        default=2000,
        help=f"texts to write (default: 2000, at most {SAMPLE_MAX_COUNT:,})",
    )
    p.add_argument("--out", type=Path, required=True, help="JSON lines file for calibrate")
    _with_settings(p, SAMPLE_SETTINGS)
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser(
        "topics",
        help="create the input, output and dead-letter topics",
        epilog=_short_forms_epilog(TOPICS_SETTINGS),
    )
    p.add_argument(
        "--partitions",
        type=positive,
        default=2,
        help="partitions of each topic it creates (default: 2); existing topics are left as"
        " they are",
    )
    _with_settings(p, TOPICS_SETTINGS)
    p.set_defaults(func=_cmd_topics)
