"""Prometheus metrics, computed from the database at scrape time (placeholder until item 2)."""


def exposition() -> tuple[bytes, str]:
    """Return the text exposition and its content type."""
    return b"", "text/plain; version=0.0.4; charset=utf-8"
