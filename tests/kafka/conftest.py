"""tests/kafka: tests of daemon/kafka/ (the shared fixtures come from tests/conftest.py)."""
