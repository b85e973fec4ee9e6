"""Test support code that is not a test module: broker harnesses and their helpers."""
