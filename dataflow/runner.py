"""Runs a flow after a bounded check that Kafka and its topics are there."""

from __future__ import annotations

from collections.abc import Callable

from bytewax.dataflow import Dataflow
from bytewax.run import cli_main

from dataflow.kafka_io import check_cluster
from schemas.settings import Settings

FlowBuilder = Callable[[Settings], Dataflow]


def required_topics(settings: Settings) -> list[str]:
    k = settings.kafka
    return [k.input_topic, k.output_topic, k.dead_letter_topic]


def run(settings: Settings, build: FlowBuilder) -> None:
    """Check the cluster (raises :class:`~dataflow.kafka_io.KafkaUnavailable`), then run.

    Blocks until the flow ends: at the end of the input when ``kafka.tail`` is false,
    otherwise until interrupted.
    """
    check_cluster(settings.kafka, required_topics(settings))
    cli_main(build(settings), workers_per_process=1)
