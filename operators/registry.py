"""The Schema Registry seen from a worker: one client per process, a bounded start-up
check, and calls that ride through an outage the way the Kafka sink does.

The client is confluent-kafka's own ``SchemaRegistryClient``; it caches schemas by id,
so a running job asks the registry once per schema, not once per record.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError

from kascade.errors import KascadeError
from kascade.schemas.events import RegistrySettings

log = logging.getLogger(__name__)
T = TypeVar("T")
_BACKOFF_MAX_S = 10.0


class RegistryUnavailable(KascadeError):
    """The Schema Registry could not be reached (at start, or for longer than tolerated)."""


@functools.lru_cache(maxsize=4)
def client(settings: RegistrySettings) -> SchemaRegistryClient:
    """This process's client for ``settings`` (created on first use, in the worker)."""
    return SchemaRegistryClient(settings.client_config())


def is_outage(e: BaseException) -> bool:
    """Whether ``e`` says the registry is unreachable or failing, not that a record or a
    schema is wrong.

    confluent-kafka talks HTTP through httpx (or its fork httpx2, by version), whose
    connection and timeout errors share the base ``TransportError``.
    """
    if isinstance(e, SchemaRegistryError):
        return e.http_status_code >= 500 or e.http_status_code in (408, 429)
    return any(
        c.__name__ == "TransportError" and c.__module__.startswith("httpx") for c in type(e).__mro__
    )


def riding_outages(
    settings: RegistrySettings,
    call: Callable[[], T],
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, retried with backoff while the registry is unreachable, for up to
    ``outage_tolerance_s``; then :class:`RegistryUnavailable`. Other errors pass on.

    >>> attempts = []
    >>> def flaky():
    ...     attempts.append(1)
    ...     if len(attempts) < 3:
    ...         raise SchemaRegistryError(503, 50301, "busy")
    ...     return "ok"
    >>> riding_outages(RegistrySettings(url="http://r"), flaky, sleep=lambda s: None)
    'ok'
    """
    started = clock()
    wait = 0.5
    while True:
        try:
            return call()
        except Exception as e:
            if not is_outage(e):
                raise
            waited = clock() - started
            if waited >= settings.outage_tolerance_s:
                raise RegistryUnavailable(
                    f"Schema Registry at {settings.shown_url} unreachable for {waited:.0f} s"
                    f" (registry.outage_tolerance_s = {settings.outage_tolerance_s:g}):"
                    f" {_without_url(e, settings)}"
                ) from None
            log.warning(
                "Schema Registry at %s unreachable (%s); retrying",
                settings.shown_url,
                _without_url(e, settings),
            )
            sleep(wait)
            wait = min(wait * 2, _BACKOFF_MAX_S)


def check_registry(settings: RegistrySettings) -> None:
    """:class:`RegistryUnavailable` within ``registry.timeout_s`` unless the registry
    answers; run before the dataflow starts, like the Kafka cluster check."""
    if settings.url is None:
        return
    try:
        SchemaRegistryClient(settings.client_config()).get_subjects()
    except Exception as e:
        why = (
            f"HTTP {e.http_status_code}: {e.error_message}"
            if isinstance(e, SchemaRegistryError)
            else f"{type(e).__name__}: {e}"
        )
        raise RegistryUnavailable(
            f"cannot use the Schema Registry at {settings.shown_url} within"
            f" {settings.timeout_s:g}s: {_without_url(why, settings)}"
        ) from None


def _without_url(error: object, settings: RegistrySettings) -> str:
    """An error's text with the registry's URL (and any password in it) as shown."""
    text = str(error)
    if settings.url is None:
        return text
    text = text.replace(settings.url, str(settings.shown_url))
    password = urlsplit(settings.url).password
    return text.replace(password, "***") if password else text
