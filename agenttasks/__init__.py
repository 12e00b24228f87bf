"""Durable background tasks for AI agents, as a reusable Django app."""

from .compat import moved

__version__ = "0.3.0"

moved.install()
