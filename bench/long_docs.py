"""Long documents, read as far as their label needs: kascade reading everything, kascade
with its certified document stop, and the two jobs a user writes first (PyTorch FP32,
batch 32: truncating at 512 tokens, or reading whole documents in 512-token windows and
averaging their probabilities), side by side on the same documents through Kafka.

Documents are single-language, single-topic texts of 2k, 4k or 8k tokens built from
SIB-200 sentences of 20 languages; some open with about 700 tokens of forwarded-mail
headers and a legal disclaimer (made up here, in English as such openings often are).
The heads and chunk thresholds are calibrated on documents from the ``heads`` split, the
stop on documents from the ``calibration`` split, and test documents come from the
held-out split: no sentence is in two of them.

    python -m bench.long_docs documents --data runs/sib200 --split heads --count 300 \\
        --boilerplate-share 0.3 --tokenizer-model runs/e5-int8pc --out runs/long/texts.jsonl
    python -m bench.long_docs documents --data runs/sib200 --split calibration --count 700 \\
        --boilerplate-share 0.3 --tokenizer-model runs/e5-int8pc --out runs/long/docs.jsonl
    kascade calibrate --model runs/e5-int8pc --texts runs/long/texts.jsonl \\
        --documents runs/long/docs.jsonl --epsilon 0.02 --epsilon-doc 0.01
    python -m bench.long_docs headline --checkpoint runs/e5-sib200 \\
        --kascade-model runs/e5-int8pc --data runs/sib200 --json runs/long/headline.json
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.baseline import naive_consumer
from bench.flow import fresh_topics, kascade_run_command, send, timestamps
from bench.sib200 import language_tag
from kascade.dataflow.consume import read_all
from kascade.demo.local_broker import ensure_local_broker
from kascade.operators.encoder import load_model_dir
from kascade.schemas import InputDocument, OutputRecord
from kascade.schemas.files import write_text_atomically
from kascade.schemas.kafka import KafkaSettings

SIZES = (2000, 4000, 8000)
JOBS = ("kascade-all", "kascade-certified", "naive-512", "naive-windows")
NAMES = ("Maria Keller", "John Ade", "Li Wei", "Ana Souza", "Omar Haddad", "Priya Nair")
DISCLAIMER = (
    "CONFIDENTIALITY NOTICE: This e-mail message, including any attachments, is for the"
    " sole use of the intended recipient(s) and may contain confidential and privileged"
    " information. Any unauthorized review, use, disclosure or distribution is prohibited."
    " If you are not the intended recipient, please contact the sender by reply e-mail and"
    " destroy all copies of the original message. Messages sent to and from us may be"
    " monitored. Internet communications cannot be guaranteed to be secure or error-free as"
    " information could be intercepted, corrupted, lost, destroyed, arrive late or"
    " incomplete, or contain viruses. The sender therefore does not accept liability for"
    " any errors or omissions in the contents of this message which arise as a result of"
    " e-mail transmission. This communication is for informational purposes only and is"
    " not intended as an offer or solicitation for the purchase or sale of any financial"
    " instrument or as an official confirmation of any transaction."
)


def boilerplate(rng: random.Random, tokens, target: int = 700) -> str:
    """Forwarded-mail headers and disclaimers, about ``target`` tokens."""
    parts: list[str] = []
    while tokens(" ".join(parts)) < target:
        a, b = rng.sample(NAMES, 2)
        day = rng.randint(1, 28)
        parts.append(
            f"---------- Forwarded message ---------\nFrom: {a} <{a.split()[0].lower()}"
            f"@example.org>\nDate: {day} March 2026 at {rng.randint(7, 19)}:{rng.randint(10, 59)}"
            f"\nSubject: FW: RE: ticket #{rng.randint(10000, 99999)}\nTo: {b}"
            f" <{b.split()[1].lower()}@example.com>\nCc: records@example.net\n{DISCLAIMER}"
        )
    return "\n".join(parts)


SECTIONS = ("Home", "News", "World", "Business", "Sport", "Culture", "Opinion", "Video")


def web_boilerplate(rng: random.Random, tokens, target: int = 700) -> str:
    """A web page's chrome before its article: navigation, a cookie banner, share and
    subscribe prompts, about ``target`` tokens (another opening than :func:`boilerplate`)."""
    parts: list[str] = []
    while tokens(" ".join(parts)) < target:
        nav = " | ".join(rng.sample(SECTIONS, 6))
        parts.append(
            f"{nav} | Log in | Subscribe\nWe use cookies and similar technologies to give you"
            " a better experience, to personalise content and ads and to analyse our traffic."
            " By clicking Accept all you agree to this; choose Manage settings to decide which"
            f" partners may store data. Accept all | Reject all | Manage settings\nShare on"
            f" social media · Copy link · {rng.randint(2, 480)} comments · Updated"
            f" {rng.randint(1, 28)} March 2026, {rng.randint(7, 22)}:{rng.randint(10, 59)}"
            " GMT\nAdvertisement · Continue reading below"
        )
    return "\n".join(parts)


USERS = ("mkeller", "j_ade", "liwei88", "asouza", "ohaddad", "pnair")


def forum_boilerplate(rng: random.Random, tokens, target: int = 700) -> str:
    """A forum thread's furniture before its first post: breadcrumbs, the posters' cards
    and signatures, reply and quote buttons, about ``target`` tokens."""
    parts: list[str] = []
    while tokens(" ".join(parts)) < target:
        user = rng.choice(USERS)
        parts.append(
            f"Forum index » General discussion » Page {rng.randint(1, 40)} of"
            f" {rng.randint(41, 90)}\n{user} · Senior member · Joined {rng.randint(1, 12)}/"
            f"{rng.randint(2009, 2025)} · Posts: {rng.randint(10, 9000)} · Reputation:"
            f" {rng.randint(0, 500)}\nPosted {rng.randint(2, 59)} minutes ago · #"
            f"{rng.randint(1, 300)} · Reply · Quote · Report · Like ({rng.randint(0, 40)})\n"
            "-- \nSent from my phone. Opinions are my own. Please read the forum rules"
            " before posting and use the search function first."
        )
    return "\n".join(parts)


def legal_boilerplate(rng: random.Random, tokens, target: int = 700) -> str:
    """Terms of use and a licence header before a document, about ``target`` tokens."""
    parts: list[str] = []
    while tokens(" ".join(parts)) < target:
        parts.append(
            f"Copyright (c) {rng.randint(1998, 2026)} {rng.choice(NAMES)}. All rights"
            " reserved. Licensed under the terms of use available at example.org/terms;"
            " you may not use this file except in compliance with them. Unless required by"
            " applicable law or agreed to in writing, the material is distributed on an AS"
            " IS BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or"
            f" implied. Document reference {rng.randint(100, 999)}-{rng.randint(1000, 9999)},"
            f" revision {rng.randint(1, 30)}."
        )
    return "\n".join(parts)


OPENINGS = {
    "mail": boilerplate,
    "web": web_boilerplate,
    "forum": forum_boilerplate,
    "legal": legal_boilerplate,
}


def openings(value: str) -> tuple[str, ...]:
    """``--opening``: one kind of opening, or several (comma-separated), drawn evenly."""
    kinds = tuple(value.split(","))
    unknown = sorted(set(kinds) - set(OPENINGS))
    if unknown:
        raise argparse.ArgumentTypeError(f"no opening {unknown}; known: {sorted(OPENINGS)}")
    return kinds


def _rows(data: Path, prefixes: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    pools: dict[tuple[str, str], list[str]] = {}
    for prefix in prefixes:
        for f in sorted(data.glob(f"{prefix}*.tsv")):
            lang = f.stem.split("-", 1)[1] if "-" in f.stem else "eng_Latn"
            with open(f, encoding="utf-8", newline="") as fh:
                for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
                    pools.setdefault((lang, r["category"]), []).append(r["text"])
    return pools


def documents(
    data: Path,
    split: str,
    count: int,
    boilerplate_share: float,
    tokenizer,
    seed: int,
    languages: int = 1,
    opening: tuple[str, ...] = ("mail",),
) -> list[tuple[InputDocument, str]]:
    """(document, topic) pairs: one topic each, in one language (tagged) or, with
    ``languages`` > 1, in that many, switching every 2-4 sentences (untagged, as a
    mixed document's language is not one); ``boilerplate_share`` of them open with
    boilerplate (:data:`OPENINGS`, each of one kind drawn from ``opening``). From the
    sentences of one split of ``bench.sib200`` (``heads``, ``calibration`` and
    ``holdout`` share none)."""
    pools = _rows(data, (split,))
    keys = sorted(pools)
    rng = random.Random(seed)

    def n_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    out = []
    for i in range(count):
        lang, topic = keys[rng.randrange(len(keys))]
        others = sorted({k[0] for k in keys if k[1] == topic} - {lang})
        langs = [lang, *rng.sample(others, min(languages, len(others) + 1) - 1)]
        size = SIZES[i % len(SIZES)]
        text: list[str] = []
        n, current, left = 0, 0, rng.randint(2, 4)
        while n < size:
            if left == 0:  # the next language's run of sentences
                current, left = (current + 1) % len(langs), rng.randint(2, 4)
            left -= 1
            s = rng.choice(pools[(langs[current], topic)])
            text.append(s)
            n += n_tokens(s)
        body = " ".join(text)
        opens = rng.random() < boilerplate_share
        kind = rng.choice(opening) if opens else None
        if kind is not None:
            body = OPENINGS[kind](rng, n_tokens) + "\n\n" + body
        meta = {"topic": topic, "boilerplate": kind, "tokens": size, "languages": langs}
        tag = language_tag(lang) if len(langs) == 1 else None
        out.append((InputDocument(id=f"{split}-{i}", text=body, lang=tag, metadata=meta), topic))
    return out


def _output_count(k: KafkaSettings) -> int:
    # Records read, not the high watermark: with exactly-once delivery (the default) every
    # transaction's commit marker takes an offset too, so the watermark runs ahead.
    return len(timestamps(k, k.output_topic))


def _wait_for(k: KafkaSettings, n: int, job: subprocess.Popen, limit_s: float = 1800) -> None:
    deadline = time.monotonic() + limit_s
    while _output_count(k) < n:
        if job.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"kascade run ended or stalled before {n} results")
        time.sleep(0.2)


def kascade_warm(
    k: KafkaSettings, model: Path, docs: list[InputDocument], *extra: str
) -> tuple[float, str]:
    """Seconds from sending ``docs`` to a running, warmed-up ``kascade run`` until its last
    result (by the broker's timestamps): start-up and model loading not counted, as for
    the naive jobs. A few short documents first load the model in every worker. And what
    the job logged."""
    warm = [InputDocument(id=f"warm-{i}", text=d.text[:2000]) for i, d in enumerate(docs[:8])]
    cmd = [a for a in kascade_run_command(k, model, *extra) if a != "--bounded"]
    # A file, not a pipe: a job that logs more than a pipe holds would block on it.
    with tempfile.TemporaryFile("w+") as log:
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
        try:
            send(k, warm)
            _wait_for(k, len(warm), job)
            t0 = time.time()
            send(k, docs)
            _wait_for(k, len(warm) + len(docs), job)
        finally:
            job.send_signal(signal.SIGTERM)
            job.wait(60)
        log.seek(0)
        said = log.read()
    done = timestamps(k, k.output_topic)
    return max(done[d.id.encode()] for d in docs) / 1000 - t0, said


def _latency(k: KafkaSettings, ids: list[str]) -> dict[str, float]:
    sent, done = timestamps(k, k.input_topic), timestamps(k, k.output_topic)
    lat = np.asarray([(done[i.encode()] - sent[i.encode()]) / 1000 for i in ids])
    return {"p50_s": float(np.percentile(lat, 50)), "p99_s": float(np.percentile(lat, 99))}


def _results(k: KafkaSettings) -> dict[str, dict]:
    return {json.loads(v)["id"]: json.loads(v) for _, v in read_all(k, k.output_topic)}


def headline(args: argparse.Namespace) -> dict:
    brokers = args.brokers or ensure_local_broker(9092).bootstrap
    tokenizer = load_model_dir(args.kascade_model).tokenizer
    rows = {}
    for name, share in (("single-topic", 0.0), ("boilerplate-first", 1.0)):
        if name not in args.sets:
            continue
        built = documents(
            args.data,
            "holdout",
            args.count,
            share,
            tokenizer,
            seed=args.seed,
            languages=args.languages,
            opening=args.opening,
        )
        docs = [d for d, _ in built]
        gold = {d.id: t for d, t in built}
        tokens = {d.id: len(tokenizer.encode(d.text, add_special_tokens=False).ids) for d in docs}
        jobs = {}
        for job in ("all", "certified"):
            if f"kascade-{job}" not in args.jobs:
                continue
            k = fresh_topics(brokers)
            seconds, said = kascade_warm(
                k,
                args.kascade_model,
                docs,
                *("--workers", "2", "--cascade.reading", job, *shlex.split(args.run_args)),
            )
            alarms = [line for line in said.splitlines() if "guarantee violated" in line]
            out = {
                i: OutputRecord.model_validate_json(json.dumps(r)) for i, r in _results(k).items()
            }
            jobs[f"kascade-{job}"] = {
                "seconds": seconds,
                "accuracy": np.mean([out[i].label == gold[i] for i in gold]),
                "tokens_read": np.mean([out[i].reading.tokens_read for i in gold]),
                "stopped_certain": np.mean([out[i].reading.stopped == "certain" for i in gold]),
                "latency": _latency(k, list(gold)),
                "alarms": alarms,
            }
        for job, windows in (("naive-512", False), ("naive-windows", True)):
            if job not in args.jobs:
                continue
            k = fresh_topics(brokers)
            send(k, docs)
            total, loading, _ = naive_consumer(k, args.checkpoint, len(docs), windows=windows)
            seconds = total - loading
            out = _results(k)
            jobs[job] = {
                "seconds": seconds,
                "accuracy": np.mean([out[i]["label"] == gold[i] for i in gold]),
                "tokens_read": np.mean(
                    [min(tokens[i], 510) if not windows else tokens[i] for i in gold]
                ),
                "latency": _latency(k, list(gold)),
            }
        for j in jobs.values():
            j["docs_per_s"] = len(docs) / j["seconds"]
            j["accuracy"] = float(j["accuracy"])
            j["tokens_read"] = float(j["tokens_read"])
        rows[name] = {
            "documents": len(docs),
            "mean_tokens": float(np.mean(list(tokens.values()))),
            "jobs": jobs,
        }
        print(json.dumps({name: rows[name]}, indent=1), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("documents", help="write documents (a text column) as JSONL")
    d.add_argument("--data", type=Path, required=True)
    d.add_argument("--split", choices=["heads", "calibration", "holdout"], required=True)
    d.add_argument("--count", type=int, required=True)
    d.add_argument("--boilerplate-share", type=float, default=0.0)
    d.add_argument("--tokenizer-model", type=Path, required=True)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, required=True)
    h = sub.add_parser("headline", help="the four jobs side by side through Kafka")
    h.add_argument("--checkpoint", type=Path, required=True)
    h.add_argument("--kascade-model", type=Path, required=True)
    h.add_argument("--data", type=Path, required=True)
    h.add_argument("--count", type=int, default=60, help="documents per set")
    h.add_argument("--seed", type=int, default=1)
    h.add_argument("--brokers")
    h.add_argument("--json", type=Path)
    h.add_argument(
        "--sets",
        type=lambda s: s.split(","),
        default=["single-topic", "boilerplate-first"],
        help="comma-separated, of single-topic,boilerplate-first (default: both)",
    )
    h.add_argument(
        "--run-args",
        default="",
        help="more arguments for the kascade jobs' kascade run, e.g."
        " '--cascade.stop-audit-fraction 0.1'",
    )
    for sub_parser in (d, h):
        sub_parser.add_argument("--languages", type=int, default=1, help="languages per document")
        sub_parser.add_argument(
            "--opening",
            type=openings,
            default=("mail",),
            help=f"kind of opening, or several comma-separated, of {','.join(OPENINGS)}",
        )
    h.add_argument(
        "--jobs",
        type=lambda s: s.split(","),
        default=JOBS,
        help=f"comma-separated, of {','.join(JOBS)} (default: all)",
    )
    args = p.parse_args()
    if args.cmd == "documents":
        tok = load_model_dir(args.tokenizer_model).tokenizer
        built = documents(
            args.data,
            args.split,
            args.count,
            args.boilerplate_share,
            tok,
            args.seed,
            languages=args.languages,
            opening=args.opening,
        )
        lines = [json.dumps({"text": doc.text, "lang": doc.lang}) for doc, _ in built]
        write_text_atomically(args.out, "\n".join(lines) + "\n")
        print(f"wrote {len(lines)} documents to {args.out}")
        return
    result = headline(args)
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
