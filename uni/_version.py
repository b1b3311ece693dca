"""The version of uni (one place; uni.__version__ and the CLI read it)."""

__version__ = "0.1.0"
