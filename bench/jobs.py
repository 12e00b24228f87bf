"""The bare django-q2 baseline job: write one row, nothing else."""

from django.db import connection


def write_row(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_rows (n) VALUES (%s)", [n])
