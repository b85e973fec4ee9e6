"""Fixtures of the change-stream tests: real Debezium (Kafka Connect + its PostgreSQL
connector) on the tests' Kafka broker and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apache_kafka import KafkaBroker
from support.debezium import DebeziumPostgres


@pytest.fixture
def debezium(broker: KafkaBroker, tmp_path: Path) -> Iterator[DebeziumPostgres]:
    """A source database of this test's own in the test PostgreSQL; the test creates its
    tables there, then ``debezium.start(tables)`` runs Kafka Connect standalone with
    Debezium's PostgreSQL connector (support/debezium.py). Afterwards the JVM is killed
    and the slot and database dropped."""
    source = DebeziumPostgres.create(tmp_path / "debezium", broker.bootstrap)
    try:
        yield source
    finally:
        source.stop()
