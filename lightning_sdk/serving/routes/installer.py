"""`RouteInstaller`: the shape of every set of routes mounted on the app beside the served APIs (this
folder's, the rollouts' routes, a run's own), so that each brings its routes behind the app's key check."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request

__all__ = ["RouteInstaller"]

RouteInstaller = Callable[[FastAPI, Callable[[Request], None]], None]
"""Adds routes to the app: called with the app and its `authorize(request)` check (raises on a bad key)."""
