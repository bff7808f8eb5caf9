"""`RouteInstaller`: the shape of every set of routes mounted on the app beside the served APIs (this
folder's, the rollouts' routes, a run's own), so that each brings its routes behind the app's key check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fastapi import FastAPI, Request

__all__ = ["Authorize", "RouteInstaller"]


class Authorize(Protocol):
    """The app's key check: raises for a missing or wrong key. Model routes call it as it is (the server's
    key or its model key pass); `owner=True` asks for the server's own key (`serving/keys.py`)."""

    def __call__(self, request: Request, *, owner: bool = False) -> None: ...


RouteInstaller = Callable[[FastAPI, Authorize], None]
"""Adds routes to the app: called with the app and its `Authorize` check."""
