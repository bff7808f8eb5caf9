"""The package's version, in a module of its own so that any layer can read it without importing the
public API above it (the serving app reports it in its OpenAPI document)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
