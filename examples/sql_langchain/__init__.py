"""Placeholder docstring, replaced by the example."""
