"""Kafka sources: consumer-group members that feed table writers exactly once."""

from daemon.kafka._dead_letter import DEAD_LETTER_COLUMNS, dead_letter_schema
from daemon.kafka._source import KafkaSource

__all__ = ["DEAD_LETTER_COLUMNS", "KafkaSource", "dead_letter_schema"]
