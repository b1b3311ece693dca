"""Shared test helpers and test doubles (tests/README.md): imported as ``support.<module>``."""
