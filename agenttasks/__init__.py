"""Durable background tasks for AI agents, as a reusable Django app."""

__version__ = "0.3.0"
