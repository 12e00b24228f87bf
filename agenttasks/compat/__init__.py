"""The only place that may touch another package's internals, or keep an old name working."""
