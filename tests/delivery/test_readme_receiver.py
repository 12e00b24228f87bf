"""The README's callback receiver ("Receiving a callback"): its standard-library function accepts
what agenttasks signs and refuses what agenttasks.delivery.signatures.verify refuses (docs/rest.md#callbacks).
"""

import ast
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agenttasks.delivery.signatures import SIGNATURE_HEADER, InvalidSignature, signature, verify

README = Path(__file__).resolve().parents[2] / "README.md"
SECRET = "whsec-test"
BODY = json.dumps(
    {
        "taskId": "task_V1StGXR8_Z5jdHi6B-myT",
        "status": "completed",
        "timestamp": "2025-01-01T00:00:05.000Z",
    },
    separators=(",", ":"),
).encode()


def readme_snippet() -> str:
    section = README.read_text().split("\n### Receiving a callback\n", 1)[1].split("\n## ", 1)[0]
    blocks = [
        b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "def verify_callback(" in b
    ]
    assert len(blocks) == 1, "the section has one stdlib function, verify_callback"
    return blocks[0]


@pytest.fixture(scope="module")
def verify_callback():
    scope: dict = {}
    exec(compile(readme_snippet(), "README.md", "exec"), scope)
    return scope["verify_callback"]


def signed(body=BODY, secret=SECRET, at=None) -> dict:
    """The headers agenttasks sends with a callback signed at `at` (now by default)."""
    return {SIGNATURE_HEADER: signature(secret, int(time.time() if at is None else at), body)}


def both(verify_callback, headers, body=BODY, secret=SECRET, tolerance=300) -> tuple[bool, bool]:
    """What the README's function says, and what agenttasks.delivery.signatures.verify says."""
    try:
        verify(headers, body, secret, tolerance)
        package = True
    except InvalidSignature:
        package = False
    return verify_callback(headers, body, secret, tolerance), package


def test_the_snippet_imports_only_the_standard_library_and_compares_in_constant_time():
    tree = ast.parse(readme_snippet())
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= set(sys.stdlib_module_names), imported
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "hmac.compare_digest" in calls
    assert not any(
        isinstance(n, ast.Compare) and "digest" in ast.unparse(n) for n in ast.walk(tree)
    )


def test_a_fresh_signature_is_accepted(verify_callback):
    assert both(verify_callback, signed()) == (True, True)


def test_the_header_name_is_matched_in_any_case(verify_callback):
    value = signed()[SIGNATURE_HEADER]
    for name in ("x-agenttasks-signature", "X-AGENTTASKS-SIGNATURE"):
        assert both(verify_callback, {"Content-Type": "application/json", name: value}) == (
            True,
            True,
        )


@pytest.mark.parametrize(
    "case",
    ["another body", "one byte more", "another secret", "no header", "no v1", "no t", "t moved"],
)
def test_what_was_not_signed_so_is_refused(verify_callback, case):
    now = int(time.time())
    headers, body, secret = signed(at=now), BODY, SECRET
    if case == "another body":
        body = BODY.replace(b"completed", b"cancelled")
    elif case == "one byte more":
        body = BODY + b" "
    elif case == "another secret":
        secret = "whsec-other"
    elif case == "no header":
        headers = {"Content-Type": "application/json"}
    elif case == "no v1":
        headers = {SIGNATURE_HEADER: f"t={now}"}
    elif case == "no t":
        headers = {SIGNATURE_HEADER: headers[SIGNATURE_HEADER].split(",", 1)[1]}
    elif case == "t moved":  # the signature of one time presented with another
        headers = {SIGNATURE_HEADER: headers[SIGNATURE_HEADER].replace(f"t={now}", f"t={now - 1}")}
    assert both(verify_callback, headers, body, secret) == (False, False)


@pytest.mark.parametrize(
    ("age", "tolerance", "accepted"),
    [
        (250, 300, True),  # inside the replay window
        (-250, 300, True),  # the sender's clock a little ahead
        (400, 300, False),  # signed too long ago: a replay
        (-400, 300, False),  # signed too far ahead
        (60, 30, False),  # a shorter window of the receiver's choosing
        (60, 120, True),
    ],
)
def test_the_age_is_checked_both_ways(verify_callback, age, tolerance, accepted):
    headers = signed(at=time.time() - age)
    assert both(verify_callback, headers, tolerance=tolerance) == (accepted, accepted)


def test_it_runs_on_a_python_without_site_packages():
    """No Django, no agenttasks: only the standard library (`python -I -S`)."""
    script = readme_snippet() + (
        "\nimport json, sys\n"
        "headers, body = json.loads(sys.argv[1]), sys.argv[2].encode()\n"
        "assert 'django' not in sys.modules and 'agenttasks' not in sys.modules\n"
        f"print(verify_callback(headers, body, {SECRET!r}), verify_callback(headers, body + b'x', {SECRET!r}))\n"
    )
    answer = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, json.dumps(signed()), BODY.decode()],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert answer.stdout.split() == ["True", "False"]
