"""The SQL functions the migrations install on PostgreSQL: one file per version of a function.

A later migration adds a file with the next version (`_v2`) instead of rewriting one that a
database may already hold.
"""

from importlib.resources import files


def read(name: str) -> str:
    """Return the text of one of this package's `.sql` files."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")
