"""Assembles kascade's dataflows from settings: one function from ``Settings`` to ``Dataflow``.

Every flow shares the same edges: Kafka in, decode + validate, and a dead-letter topic
that receives the original bytes and the reason for anything the flow could not handle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError
from bytewax.dataflow import Dataflow, Stream

from kascade.dataflow import processes
from kascade.dataflow.exactly_once import TransactionalSink, route
from kascade.dataflow.kafka_io import DeliveryCheckedSink, source
from kascade.errors import UsageError
from kascade.operators import backends
from kascade.operators.bound import BoundTest, Watch
from kascade.operators.calibration import Cascade
from kascade.operators.cascade import cascade
from kascade.operators.chunking import chunk, with_text
from kascade.operators.encoder import Loaded, load_model_dir
from kascade.operators.formats import Reader, Writer
from kascade.operators.full_model import classify, read_stopped
from kascade.operators.guarantee import Guard, Shared
from kascade.operators.items import ChunkResult, FullRead, Outcome, Outgoing
from kascade.operators.live_test import live_test
from kascade.operators.reduce import Labeling, assemble
from kascade.operators.serialize import dead_letter_value, output_value
from kascade.operators.streams import by_class
from kascade.operators.validate import Received, kafka_errors, validate
from kascade.schemas import CascadeUse, DeadLetter, ModelIdentity
from kascade.schemas.cascade import CASCADE_FILE, CascadeMismatch, StopRule
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import TOKENIZER
from kascade.schemas.quarantine import Coordinates, Quarantine
from kascade.schemas.settings import Delivery, Settings

log = logging.getLogger(__name__)


def condemned(settings: Settings) -> dict[Coordinates, str]:
    """Records that killed worker processes too often to be read again (by position)."""
    if settings.recovery_dir is None:
        return {}
    quarantine = Quarantine.load(settings.recovery_dir)
    return quarantine.condemned(after=settings.restarts.quarantine_after)


def ingest(flow: Dataflow, settings: Settings) -> tuple[Stream[Received], Stream[DeadLetter]]:
    """Kafka input decoded into documents, plus dead letters for what could not be read."""
    raw = op.input("kafka_in", flow, source(settings.kafka, [settings.kafka.input_topic]))
    consumer_failed, read = by_class("kafka_error", raw, KafkaError)
    reader = Reader(
        settings.input, settings.registry, keep_event=settings.output.shape == "enriched"
    )
    checked = validate(
        "validate",
        read,
        max_bytes=settings.max_text_bytes,
        condemned=condemned(settings),
        reader=reader,
    )
    consumer_errors = kafka_errors("kafka_errors", consumer_failed)
    return checked.docs, op.merge("dead", checked.dead, consumer_errors)


def deliver(labels: Stream[Outgoing], dead: Stream[DeadLetter], settings: Settings) -> None:
    """Write labels and dead letters (keyed like the original record, cut down to what
    the broker accepts) to their topics: exactly once, in transactions that commit before
    each snapshot, or at least once (``delivery``)."""
    k = settings.kafka
    limit = k.record_limit()
    dead_out = op.map(
        "dead_letter_serialize",
        dead,
        lambda d: dead_letter_value(d, max_bytes=limit, topic=k.dead_letter_topic),
    )
    results = op.merge("to_kafka", labels, dead_out)
    if settings.delivery is Delivery.EXACTLY_ONCE:
        routed = op.map("by_input_partition", results, lambda o: route(o, k.input_topic))
        op.output("kafka_out", routed, TransactionalSink(k, settings.recovery_dir))
    else:
        op.output("kafka_out", results, DeliveryCheckedSink(k))


def public_name(source: str) -> str:
    """What records call a model: a hub id as it is, a local directory by its own name
    only (a path says where someone's files are, not which model it is).

    >>> public_name("/home/alice/models/ft-e5"), public_name("jhu-clsp/mmBERT-small")
    ('ft-e5', 'jhu-clsp/mmBERT-small')
    >>> public_name("./runs/ft"), public_name("~/ft")
    ('ft', 'ft')
    """
    windows = len(source) > 2 and source[1] == ":" and source[2] in "\\/"
    if source.startswith(("/", ".", "~")) or windows or "\\" in source:
        return PureWindowsPath(source).name if "\\" in source else PurePosixPath(source).name
    return source


def model_identity(model: Loaded, cascade: Cascade | None = None) -> ModelIdentity:
    """The model, and the calibration in force when the cascade runs (a new cascade.json
    takes effect on the next start; its records say so)."""
    m = model.manifest
    return ModelIdentity(
        name=public_name(m.source),
        variant=m.variant,
        manifest_sha256=model.manifest_sha256,
        cascade_sha256=None if cascade is None else cascade.sha256,
    )


def cascade_use(settings: Settings, model: Loaded) -> tuple[CascadeUse, Cascade | None, Engine]:
    """Whether the flow runs the cheap stages (``cascade.mode``, the model's
    ``cascade.json``, and whether it was certified on this run's chunking and engine),
    with the cascade when it does (loaded once, for everything the run reads of it), and
    the engine the run uses: under ``encoder.backend=auto`` the one the cascade was
    certified with, where this host runs it.

    Raises :class:`CascadeMismatch` for a cascade that cannot serve this run, unless
    ``cascade.if_uncertified`` says to go on without it.
    """
    c = settings.cascade
    present = (model.directory / CASCADE_FILE).is_file()
    if c.mode == "off" or (c.mode == "auto" and not present):
        return CascadeUse.OFF, None, backends.resolve(settings.encoder, model.manifest)
    cascade = Cascade.load(
        model.directory, model.manifest_sha256, c.operating_point, model.manifest
    )
    engine = backends.resolve(settings.encoder, model.manifest, cascade.spec.engine)
    problem = cascade.certified_for(settings.chunking, model.manifest.files[TOKENIZER], engine)
    if problem is None:
        return CascadeUse.ON, cascade, engine
    if c.if_uncertified == "refuse":
        raise CascadeMismatch(
            f"{problem}: run with the certified settings, run kascade calibrate again, or"
            " set cascade.if_uncertified=full_model to classify every chunk with the full model"
        )
    log.warning("%s; every chunk goes to the full model (cascade.if_uncertified)", problem)
    return CascadeUse.UNCERTIFIED, None, engine


def document_stop(settings: Settings, model: Loaded, cascade: Cascade | None) -> StopRule | None:
    """The certified stop a run reads documents up to (``None``: it reads every chunk),
    from ``cascade.reading`` and the cascade in force (``None``: the cascade is off).

    Raises :class:`CascadeMismatch` when certified reading is asked for and cannot be had;
    ``auto`` reads every chunk instead (saying why, where a stop exists but cannot serve).
    """
    c = settings.cascade
    if c.reading == "all":
        return None
    why = None
    if cascade is None:
        why = "the document stop reads the cascade's verdicts, and the cascade is off"
    else:
        stop = cascade.spec.document_stop
        if stop is None:
            why = (
                f"{model.directory / CASCADE_FILE} has no certified document stop; run"
                " kascade calibrate --documents"
            )
        elif stop.aggregation != settings.aggregation:
            why = (
                f"the document stop was certified for aggregation {stop.aggregation.value},"
                f" this run uses {settings.aggregation.value}"
            )
            if c.reading == "auto":
                log.warning("%s: reading every chunk", why)
        else:
            return stop.rule
    if c.reading == "certified":
        raise CascadeMismatch(f"cascade.reading=certified: {why}")
    return None


@dataclass(frozen=True)
class Prepared:
    """A run's verified model, and what it will do with it."""

    model: Loaded
    cascade: CascadeUse
    in_force: Cascade | None  # the cascade the run serves (None: every chunk, full model)
    stop: StopRule | None  # None: documents are read to the end
    engine: Engine  # what runs the graphs on every worker

    def describe(self, settings: Settings) -> str:
        """The line a job starts with: where it reads and writes, what it serves, how."""
        k, m = settings.kafka, self.model.manifest
        reading = "every chunk" if self.stop is None else f"until {self.stop.describe()}"
        processes = (
            f"process {settings.process_id} of {len(settings.hosts)} hosts"
            if settings.hosts is not None
            else f"{settings.workers} worker process{'es' if settings.workers > 1 else ''}"
        )
        parts = [
            f"kafka {k.brokers}: {k.input_topic} -> {k.output_topic}"
            f" (dead letters -> {k.dead_letter_topic}, {'tailing' if k.tail else 'to the end'})",
            f"model {self.model.directory} ({m.variant}, {len(m.labels)} labels,"
            f" {self.engine.name})",
            f"cascade {self.cascade.value}, reading {reading}",
            f"{processes} x {settings.encoder.threads} thread"
            + ("s" if settings.encoder.threads > 1 else ""),
            f"delivery {settings.delivery.value}",
        ]
        if settings.recovery_dir is not None:
            parts.append(f"recovery {settings.recovery_dir}")
        if settings.metrics_port is not None:
            parts.append(f"metrics http://{settings.metrics_host}:{settings.metrics_port}/metrics")
        return "running: " + "; ".join(parts)


def prepare(settings: Settings) -> Prepared:
    """The verified model of a run, after every check that needs no broker: the model
    directory against its manifest, the chunk size against the model, the cascade."""
    if settings.model_dir is None:
        raise UsageError(
            "no model: pass --model-dir DIR (or KASCADE_MODEL_DIR, or model_dir in --config)"
        )
    model = load_model_dir(settings.model_dir)
    if settings.chunking.max_tokens > model.manifest.max_length:
        raise UsageError(
            f"chunk size {settings.chunking.max_tokens} exceeds the model's maximum length"
            f" {model.manifest.max_length}"
        )
    use, in_force, engine = cascade_use(settings, model)
    return Prepared(model, use, in_force, document_stop(settings, model, in_force), engine)


def watch_the_bound(settings: Settings, cascade: Cascade, stops: bool) -> Guard:
    """This process's guard of the certified bound. The job's one test runs on whichever
    worker holds its key, at the calibration's delta; its suspensions reach every process
    through the directory they share (the recovery directory, or one the supervisor made
    for the run), where a restarted process finds them too."""
    point = cascade.point
    # Every stratum the calibration certified is tested on its own, however many.
    tested = max(settings.cascade.max_languages, len(point.strata))
    watch = Watch(point.epsilon, point.delta, tested, cascade.sha256)
    stop = cascade.spec.document_stop
    if stops and stop is not None:  # the run stops documents early: the stop's test too
        watch.stop = BoundTest(stop.epsilon, stop.delta)
    suspend = settings.cascade.on_violation == "full_model"
    shared = None
    where = settings.recovery_dir or processes.shared_dir()
    if where is not None and cascade.sha256 is not None:
        shared = Shared(where, cascade.sha256)
    return Guard(watch, suspend=suspend, shared=shared)


def build_flow(settings: Settings, prepared: Prepared | None = None) -> Dataflow:
    """The classifying flow: Kafka -> chunks -> full model on any worker -> per-document
    label -> Kafka, with dead letters for what cannot be read or is too long.

    ``prepared`` is what :func:`prepare` returned for ``settings`` (checked once per job,
    so its warnings are said once); by default it is prepared here.
    """
    prepared = prepared or prepare(settings)
    model, use, in_force = prepared.model, prepared.cascade, prepared.in_force
    labeling = Labeling(
        labels=model.manifest.labels,
        aggregation=settings.aggregation,
        model=model_identity(model, in_force),
        cascade=use,
    )
    flow = Dataflow("kascade")
    docs, dead = ingest(flow, settings)
    late_dead, outcomes = [], None
    if in_force is not None:
        # The cascade chunks each document itself, only as far as it reads.
        read = with_text("with_text", docs)
        results, outcomes, cascade_dead = _cascaded(read.texts, settings, prepared, in_force)
        empty = read.empty
        late_dead.append(cascade_dead)
    else:
        chunked = chunk("chunk", docs, model.tokenizer, settings.chunking)
        everything = op.redistribute("spread", chunked.chunks)
        results = classify("classify", everything, model, settings.encoder, prepared.engine)
        empty = chunked.empty
        late_dead.append(chunked.dead)
    records = assemble("assemble", results, empty, labeling, outcomes)
    limit = settings.kafka.record_limit()
    writer = Writer(settings.output, settings.registry, settings.kafka.output_topic)
    serialized = op.map(
        "serialize",
        records,
        lambda r: output_value(r, writer, max_bytes=limit, stage="serialize"),
    )
    unsendable, sendable = by_class("unsendable", serialized, DeadLetter)
    deliver(sendable, op.merge("all_dead", dead, unsendable, *late_dead), settings)
    return flow


def _cascaded(
    texts: Stream[Received], settings: Settings, prepared: Prepared, in_force: Cascade
) -> tuple[Stream[ChunkResult], Stream[Outcome], Stream[DeadLetter]]:
    """Chunks through the cheap stages, the rest (and the audits) through the full model:
    every chunk's result, how each document was read, and the dead letters the cascade
    step made."""
    # This process's guard, handed to the two steps that use it (no module global): the
    # cascade asks it what is suspended, the live test counts the audits into it.
    guard = watch_the_bound(settings, in_force, stops=prepared.stop is not None)
    model = prepared.model
    cheap = cascade(
        "cascade",
        texts,
        model,
        in_force,
        settings.cascade,
        settings.chunking,
        settings.encoder.threads,
        prepared.engine,
        settings.aggregation,
        prepared.stop,
        guard,
    )
    # Chunks of one document may run on different workers: the full model is the cost.
    spread = op.redistribute("spread", cheap.escalations)
    reads, chunks = by_class("full_reads", spread, FullRead)
    full = classify("classify", chunks, model, settings.encoder, prepared.engine, "stages")
    checked = read_stopped(
        "read_stopped", reads, model, settings.encoder, prepared.engine, "stages"
    )
    escalated = live_test("live_test", full, checked, guard, in_force)
    return op.merge("results", cheap.settled, escalated), cheap.outcomes, cheap.dead
