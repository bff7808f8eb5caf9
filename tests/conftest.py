"""Shared fixtures live in tests/fixtures/, one module per part of the system."""

pytest_plugins = [
    "tests.fixtures.openai_server",
    "tests.fixtures.engine",
    "tests.fixtures.training",
]
