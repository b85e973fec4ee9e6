"""tests/kafka: Kafka tests that need a secured broker (tests/support/secure_broker.py).

The shared fixtures (make_config, run_daemon, ...) come from tests/conftest.py.
"""
