"""Adversarial JSON against every write endpoint, driven by hypothesis.

Bodies are written as JSON text, so they can hold what `json.dumps` never writes: nesting far
deeper than any limit, numbers beyond every range, NaN and Infinity, lone surrogates and NUL
escapes, 10,000-element arrays and 100,000-character strings, in every field, file entries
included. Every answer must be 2xx or 4xx with the error envelope, and a refused request must
leave no row and no stored file behind.

`AGENTTASKS_FUZZ_SCALE=10` multiplies the examples (`make fuzz`).
"""

import json
import os
from pathlib import Path

import pytest
from django.apps import apps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import agenttasks, b64
from .test_api_schemathesis import CODES

pytestmark = pytest.mark.django_db(transaction=True)

SCALE = float(os.environ.get("AGENTTASKS_FUZZ_SCALE") or 1)
EXAMPLES = max(1, round(40 * SCALE))


def nested(depth: int, kind: str = "object") -> str:
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


# --- JSON text, hostile and plain -----------------------------------------------------------

HOSTILE = [
    nested(40),
    nested(1000),
    nested(100_000),
    nested(33, "list"),
    nested(5000, "list"),
    "1" * 5000,  # more digits than Python converts
    "-" + "9" * 400,
    "1e400",
    "-1e400",
    "1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1.7976931348623157e308",
    "-0",
    "-0.0",
    '"\\ud800"',
    '"x\\udfffy"',
    '"\\udbff\\udbff"',
    '"\\u0000"',
    '"a\\u0000b"',
    '"\\\\u0000"',
    '""',
    '"   "',
    "[" + ",".join(["1"] * 10_000) + "]",
    "[" + ",".join(['"x"'] * 10_000) + "]",
    "[" + ",".join(["{}"] * 10_000) + "]",
    "{" + ",".join(f'"k{i}":{i}' for i in range(10_000)) + "}",
    json.dumps("文" * 100_000, ensure_ascii=False),
    json.dumps("é" * 100_001),
    json.dumps("🦀" * 50_000, ensure_ascii=False),
    json.dumps("a\u0301" * 20_000),
    json.dumps("\u202e\ufeff\u200b" * 1000, ensure_ascii=False),
    json.dumps("x" * 2001),
    "null",
    "true",
    "false",
    "{}",
    "[]",
]


# Filled per endpoint with the nesting depths right at what its parser can take.
EDGE: list[str] = []
MALFORMED = "Malformed JSON body"


def text_of(value) -> str:
    return json.dumps(value, ensure_ascii=True)


# Strings with any code point, lone surrogates included (escaped, as a client would send them).
strings = st.text(
    st.one_of(st.characters(), st.characters(categories=["Cs", "Cc"])), max_size=40
).map(text_of)
edge = st.integers(0, 3).map(lambda i: EDGE[i] if i < len(EDGE) else "null")
scalars = st.one_of(
    st.sampled_from(HOSTILE),
    edge,
    strings,
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["null", "true", "false"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.dictionaries(strings, inner, max_size=4).map(
            lambda d: "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=8,
)


def obj(fields: dict) -> str:
    """A JSON object from field name -> JSON text."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields.items()) + "}"


# Each body starts valid, so that a mutation reaches the checks and the writes behind the ones
# before it; then up to three of its fields (file entries' fields included) are replaced by
# hostile values or dropped, and a stray field may be added. One body in ten is any JSON text.
FILE = {"name": "notes.txt", "content": b64(b"abc"), "mimeType": "text/plain"}
VALID = {
    "createTask": {
        "agentId": "echo",
        "input": "hello",
        "label": "a label",
        "metadata": {"k": "v"},
        "callbackUrl": "https://93.184.216.34/cb",
        "files": [FILE],
    },
    "addTaskComment": {"content": "more", "metadata": {"k": "v"}},
    "cancelTask": {"graceful": True},
    "retryTask": {},
    "createConversation": {"agentId": "echo", "title": "a title", "metadata": {"k": "v"}},
    "updateConversation": {"title": "renamed", "metadata": {"k": "v"}},
    "deleteConversation": {},
    "postMessage": {"message": "hi", "metadata": {"k": "v"}, "stream": False, "files": [FILE]},
    "answerApproval": {"approved": True, "comment": "ok"},
    "answerQuestion": {"answers": {"q1": "PDF"}},
}
# Values worth trying in one field in particular.
SPECIAL = {
    "agentId": ["docs", "internal", "nofiles", "", " echo"],
    "name": [
        "文" * 100 + ".txt",
        "文" * 255,
        "é" * 256,
        "../../etc/passwd",
        "..",
        ".",
        "a/b\\c.txt",
        " ",
        "CON",
        "x" * 255,
        "\u202etxt.exe",
    ],
    "content": ["not base64!", b64(b"x" * 2000), "", "YWJj\n", "YW Jj", "YWJ"],
    "mimeType": ["text/plain; charset=utf-8", "TEXT/PLAIN", "*/*", "image/png", "text", ""],
    "callbackUrl": [
        "http://[2002:c0a8:101::1]/",
        "http://127.0.0.1:8000/",
        "https://93.184.216.34:22/",
        "ftp://x/",
        "http://u:p@93.184.216.34/",
    ],
    "answers": [{"q1": {"values": ["HTML"], "freeText": "x"}}, {"q1": ["PDF", "HTML"]}, {}],
    "graceful": [False, 0, "true"],
    "approved": [False, 1, "yes"],
    "stream": [True, "false"],
}


def paths(body: dict) -> list[tuple]:
    """Where a mutation can land: each field, and each field of each file entry."""
    out = [(key,) for key in body]
    for i, entry in enumerate(body.get("files") or []):
        out += [("files", i, key) for key in entry]
    return out


@st.composite
def mutated(draw, operation: str) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    body = json.loads(json.dumps(VALID[operation]))  # a copy
    texts: dict = {}  # path -> JSON text replacing the value there
    for _ in range(draw(st.integers(0, 3))):
        where = paths(body)
        if not where:
            break
        path = draw(st.sampled_from(where))
        special = [text_of(v) for v in SPECIAL.get(path[-1], [])]
        choice = draw(st.integers(0, 9))
        if choice < 3 and special:
            texts[path] = draw(st.sampled_from(special))
        elif choice < 5:
            texts[path] = draw(edge)
        elif choice < 9:
            texts[path] = draw(values)
        else:
            texts[path] = None  # the field left out
    stray = draw(st.dictionaries(strings.map(json.loads), values, max_size=1))
    return render(body, texts, (), stray)


def render(value, texts: dict, path: tuple, stray=None) -> str:
    """JSON text of `value`, with the JSON texts of `texts` at their paths."""
    if path in texts:
        return texts[path]
    if isinstance(value, dict):
        items = {
            k: render(v, texts, (*path, k)) for k, v in value.items() if texts.get((*path, k), 1)
        }
        items.update(stray or {})
        return obj(items)
    if isinstance(value, list):
        return "[" + ",".join(render(v, texts, (*path, i)) for i, v in enumerate(value)) + "]"
    return text_of(value)


BODIES = {operation: mutated(operation) for operation in VALID}


# --- the run ---------------------------------------------------------------------------------


def rows() -> dict:
    counts = {m.__name__: m.objects.count() for m in apps.get_app_config("agenttasks").get_models()}
    return counts


def stored_files(media: Path) -> int:
    return sum(1 for p in media.rglob("*") if p.is_file()) if media.exists() else 0


@pytest.fixture
def targets(as_alice, workers):
    """alice's resources, every write endpoint on them; the workers stop before the fuzzing."""
    approval = as_alice.create("approver", "prod")
    question = as_alice.create("asker", "go")
    for task in (approval, question):
        as_alice.wait_status(task["id"], "waiting_for_input")
    actions = {
        t["id"]: as_alice.task(t["id"])["pendingActions"][0]["id"] for t in (approval, question)
    }
    workers.stop()  # from here on nothing but the fuzzed requests writes
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]

    def finished_task():
        task = as_alice.create("echo", "read")
        as_alice.post(f"/tasks/{task['id']}/cancel")  # a comment can re-open it
        return f"/tasks/{task['id']}"

    def idle_conversation():
        return (
            "/conversations/"
            + as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]["id"]
        )

    def action_of(task):
        return f"/conversations/{task['conversationId']}/actions/{actions[task['id']]}"

    # A path, or how to make a fresh one for each request (a comment re-opens its task and a
    # message starts a run: the next one on the same resource would only be busy).
    return {
        "createTask": ("POST", lambda: "/tasks"),
        "addTaskComment": ("POST", lambda: finished_task() + "/comments"),
        "cancelTask": ("POST", lambda: f"/tasks/{as_alice.create('echo', 'x')['id']}/cancel"),
        "retryTask": ("POST", lambda: finished_task() + "/retry"),
        "createConversation": ("POST", lambda: "/conversations"),
        "updateConversation": ("PATCH", lambda: f"/conversations/{conversation['id']}"),
        "deleteConversation": ("DELETE", lambda: "/conversations/conv_doesnotexist0000000000"),
        "postMessage": ("POST", lambda: idle_conversation() + "/messages"),
        "answerApproval": ("POST", lambda: action_of(approval)),
        "answerQuestion": ("POST", lambda: action_of(question)),
    }


def deepest_parsed(api, method, path) -> int:
    """The deepest value this server's JSON parser still parses in a body's field.

    Right below it the parser has used nearly all the stack, so whatever walks the value next
    (a check, a serializer, a database adapter) must not recurse: those depths are fuzzed too.
    """
    parsed, refused = 1, 20_000
    while refused - parsed > 1:
        depth = (parsed + refused) // 2
        response = api.request(method, path, raw='{"x":' + nested(depth) + "}")
        if response.status_code == 400 and response.json()["error"]["message"] == MALFORMED:
            refused = depth
        else:
            parsed = depth
    return parsed


@pytest.mark.parametrize("operation", sorted(BODIES))
def test_adversarial_json_is_refused_cleanly(operation, request, as_alice, settings_media):
    method, make_path = request.getfixturevalue("targets")[operation]
    seen = {"2xx": 0, "4xx": 0}
    deepest = deepest_parsed(as_alice, method, make_path())
    EDGE[:] = [nested(depth) for depth in range(deepest - 3, deepest + 1)]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(raw=BODIES[operation])
    def send(raw):
        path = make_path()
        before, files_before = rows(), stored_files(settings_media)
        response = as_alice.request(method, path, raw=raw.encode("utf-8", "surrogatepass"))
        status = response.status_code
        assert status < 500, (status, response.content[:500], raw[:300])
        if status < 300:
            seen["2xx"] += 1
            return
        seen["4xx"] += 1
        assert response["Content-Type"] == "application/json"
        envelope = response.json()
        assert set(envelope) == {"error"} and envelope["error"]["code"] in CODES, envelope
        assert set(envelope["error"]) <= {"code", "message", "details"}, envelope
        assert rows() == before, (status, envelope, raw[:300])
        assert stored_files(settings_media) == files_before, (status, envelope, raw[:300])

    with agenttasks(MAX_ACTIVE_TASKS_PER_USER=0):  # successes must not run into task_limit
        send()
    print(f"fuzz {operation}: {seen}")
    assert sum(seen.values()) >= EXAMPLES // 2


@pytest.fixture
def settings_media(settings):
    return Path(settings.MEDIA_ROOT)
