# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""LangGraph's Agent Server API (docs/langgraph.md), driven by the real `langgraph-sdk` client
against a live server and a real cluster."""

import httpx
import pytest
from langgraph_sdk import get_sync_client

from agenttasks.models import Conversation, Run

from ..conftest import wait_for
from ..mcp_support import alice, asgi_server, bob, cluster, server  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.both]
MOUNT = "/api/agents/langgraph"


def client_for(server, user):
    headers = {"Authorization": f"Token {user.token}"} if user is not None else {}
    return get_sync_client(url=server + MOUNT, api_key=None, headers=headers, timeout=60)


@pytest.fixture
def lg(server, alice):
    return client_for(server, alice)


def said(values: dict) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in values["messages"]]


def human(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def test_assistants_are_the_exposed_agents(lg):
    found = {a["graph_id"]: a for a in lg.assistants.search(limit=100)}
    assert {"echo", "slow", "approver", "asker"} <= set(found)
    echo = found["echo"]
    assert echo["assistant_id"] != "echo" and len(echo["assistant_id"]) == 36  # a UUID
    assert lg.assistants.get(echo["assistant_id"]) == echo
    assert lg.assistants.get("echo") == echo  # the graph id names it too
    assert lg.assistants.search(graph_id="echo") == [echo]
    assert "messages" in lg.assistants.get_schemas("echo")["input_schema"]["properties"]
    with pytest.raises(httpx.HTTPStatusError) as missing:
        lg.assistants.get("nobody")
    assert missing.value.response.status_code == 404


def test_a_threads_run_of_echo_gives_the_reply_in_its_values(lg, cluster):
    thread = lg.threads.create(metadata={"purpose": "test"})
    assert thread["status"] == "idle" and thread["metadata"] == {"purpose": "test"}
    run = lg.runs.create(thread["thread_id"], "echo", input=human("hi"))
    assert run["status"] in ("pending", "running") and run["thread_id"] == thread["thread_id"]
    values = lg.runs.join(thread["thread_id"], run["run_id"])
    assert said(values) == [("human", "hi"), ("ai", "Echo: hi")]
    assert lg.runs.get(thread["thread_id"], run["run_id"])["status"] == "success"
    shown = lg.threads.get(thread["thread_id"])
    assert shown["status"] == "idle" and shown["metadata"]["graph_id"] == "echo"
    # The thread is the conversation REST shows; search finds it by graph_id.
    assert Conversation.objects.get(pk=thread["thread_id"]).agent == "echo"
    assert [t["thread_id"] for t in lg.threads.search(metadata={"graph_id": "echo"})] == [
        thread["thread_id"]
    ]
    state = lg.threads.get_state(thread["thread_id"])
    assert said(state["values"])[-1] == ("ai", "Echo: hi") and state["next"] == []
    again = lg.runs.wait(thread["thread_id"], "echo", input=human("again"))
    assert said(again)[-1] == ("ai", "Echo: again")
    history = lg.threads.get_history(thread["thread_id"], limit=5)
    assert len(history) >= 2 and said(history[0]["values"])[-1] == ("ai", "Echo: again")
    assert said(history[1]["values"])[-1] == ("ai", "Echo: hi")
    assert [r["run_id"] for r in lg.runs.list(thread["thread_id"])][-1] == run["run_id"]


def test_a_stateless_run_waits_for_its_values(lg, cluster):
    values = lg.runs.wait(None, "echo", input=human("alone"))
    assert said(values) == [("human", "alone"), ("ai", "Echo: alone")]


def test_a_stream_sends_metadata_then_values_and_updates(lg, cluster):
    thread = lg.threads.create()
    parts = list(
        lg.runs.stream(
            thread["thread_id"], "echo", input=human("streamed"), stream_mode=["values", "updates"]
        )
    )
    assert parts[0].event == "metadata" and parts[0].data["run_id"]
    last_values = [p.data for p in parts if p.event == "values"][-1]
    assert said(last_values) == [("human", "streamed"), ("ai", "Echo: streamed")]
    updates = [p.data for p in parts if p.event == "updates"]
    assert {"type": "ai", "content": "Echo: streamed"}.items() <= updates[-1]["agent"]["messages"][
        0
    ].items()
    # Joining the finished run's stream after its last event replays nothing.
    run_id = parts[0].data["run_id"]
    ids = [p.id for p in parts if p.id]
    replay = list(
        lg.runs.join_stream(
            thread["thread_id"], run_id, stream_mode="values", last_event_id=ids[-1]
        )
    )
    assert [p.event for p in replay] == ["metadata"]


def test_an_approval_is_an_interrupt_that_a_resume_answers(lg, cluster):
    thread = lg.threads.create()
    asked = lg.runs.wait(thread["thread_id"], "approver", input=human("prod"))
    (interrupt,) = asked["__interrupt__"]
    assert interrupt["value"]["tool"] == "deploy" and interrupt["value"]["args"] == {"env": "prod"}
    shown = lg.threads.get(thread["thread_id"])
    assert shown["status"] == "interrupted"
    state = lg.threads.get_state(thread["thread_id"])
    assert [i["id"] for i in state["interrupts"]] == [interrupt["id"]] and state["next"] == [
        "agent"
    ]
    done = lg.runs.wait(thread["thread_id"], "approver", command={"resume": {"approved": True}})
    assert said(done)[-1] == ("ai", "deployed to prod")
    assert lg.threads.get(thread["thread_id"])["status"] == "idle"


def test_a_question_is_resumed_with_its_answer(lg, cluster):
    thread = lg.threads.create()
    asked = lg.runs.wait(thread["thread_id"], "asker", input=human("report"))
    assert asked["__interrupt__"][0]["value"]["questions"][0]["id"] == "q1"
    done = lg.runs.wait(thread["thread_id"], "asker", command={"resume": "PDF"})
    assert said(done)[-1] == ("ai", "format: PDF")
    with pytest.raises(httpx.HTTPStatusError) as nothing:  # nothing left to resume
        lg.runs.wait(thread["thread_id"], "asker", command={"resume": "HTML"})
    assert nothing.value.response.status_code == 409


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_cancelling_a_slow_run(lg, cluster, action):
    thread = lg.threads.create()
    run = lg.runs.create(thread["thread_id"], "slow", input=human("nap"), metadata={"seconds": 30})
    wait_for(lambda: Run.objects.get(pk=run["run_id"]).status == "running", timeout=30)
    lg.runs.cancel(thread["thread_id"], run["run_id"], action=action)
    wait_for(
        lambda: Run.objects.get(pk=run["run_id"]).status in ("interrupted", "rolled_back"),
        timeout=30,
    )
    if action == "interrupt":
        assert lg.runs.get(thread["thread_id"], run["run_id"])["status"] == "interrupted"
        assert said(lg.threads.get_state(thread["thread_id"])["values"])[0] == ("human", "nap")
    else:
        with pytest.raises(httpx.HTTPStatusError) as gone:
            lg.runs.get(thread["thread_id"], run["run_id"])
        assert gone.value.response.status_code == 404
        assert lg.threads.get_state(thread["thread_id"])["values"] == {"messages": []}


def test_multitask_strategies_on_a_busy_thread(lg, cluster):
    thread = lg.threads.create()
    first = lg.runs.create(thread["thread_id"], "slow", input=human("one"), metadata={"seconds": 3})
    with pytest.raises(httpx.HTTPStatusError) as refused:
        lg.runs.create(thread["thread_id"], "slow", input=human("two"), multitask_strategy="reject")
    assert refused.value.response.status_code == 409
    queued = lg.runs.create(
        thread["thread_id"], "slow", input=human("two"), metadata={"seconds": 0}
    )
    assert queued["status"] == "pending"  # enqueue, LangGraph's default
    values = lg.runs.join(thread["thread_id"], queued["run_id"])
    humans = [text for kind, text in said(values) if kind == "human"]
    assert humans == ["one", "two"]
    assert lg.runs.get(thread["thread_id"], first["run_id"])["status"] == "success"


def test_another_user_gets_404_and_anonymous_401(server, lg, bob, cluster):
    thread = lg.threads.create()
    run = lg.runs.create(thread["thread_id"], "echo", input=human("mine"))
    other = client_for(server, bob)
    calls = [
        lambda: other.threads.get(thread["thread_id"]),
        lambda: other.threads.get_state(thread["thread_id"]),
        lambda: other.threads.delete(thread["thread_id"]),
        lambda: other.runs.get(thread["thread_id"], run["run_id"]),
        lambda: other.runs.join(thread["thread_id"], run["run_id"]),
        lambda: other.runs.cancel(thread["thread_id"], run["run_id"]),
        lambda: other.runs.create(thread["thread_id"], "echo", input=human("theirs")),
    ]
    for call in calls:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            call()
        assert refused.value.response.status_code == 404
        assert "detail" in refused.value.response.json()
    assert other.threads.search() == []
    anonymous = httpx.post(server + MOUNT + "/threads/search", json={})
    assert anonymous.status_code == 401 and "detail" in anonymous.json()


def test_bad_input_and_unsupported_routes_answer_in_langgraphs_shape(server, lg):
    thread = lg.threads.create()
    auth = {"Authorization": lg.http.client.headers["Authorization"]}
    cases = [
        ("post", f"/threads/{thread['thread_id']}/runs", {"assistant_id": "nobody"}, 404),
        ("post", f"/threads/{thread['thread_id']}/runs", {"assistant_id": "echo"}, 422),
        (
            "post",
            f"/threads/{thread['thread_id']}/runs",
            {"assistant_id": "echo", "input": {"messages": "x"}},
            422,
        ),
        (
            "post",
            f"/threads/{thread['thread_id']}/runs/stream",
            {"assistant_id": "echo", "input": {"messages": ["x"]}, "stream_mode": "tasks"},
            422,
        ),
        (
            "post",
            f"/threads/{thread['thread_id']}/runs",
            {"assistant_id": "echo", "input": {"messages": ["x"]}, "interrupt_before": ["agent"]},
            422,
        ),
        ("post", "/store/items/search", {}, 404),
        ("post", "/runs/crons", {"assistant_id": "echo", "schedule": "* * * * *"}, 422),
        ("get", "/threads/nobody/state", None, 404),
        ("delete", f"/threads/{thread['thread_id']}/runs/nobody", None, 404),
        ("post", "/threads/search", {"limit": 0}, 422),
    ]
    for method, path, body, status in cases:
        answer = httpx.request(method, server + MOUNT + path, json=body, headers=auth)
        assert answer.status_code == status, (path, body, answer.text)
        assert isinstance(answer.json()["detail"], str)


def test_a_cron_is_a_schedule_whose_tick_runs_on_the_thread(lg, cluster):
    from agenttasks.lifecycle import schedules
    from agenttasks.models import Schedule

    thread = lg.threads.create()
    cron = lg.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="*/5 * * * *", input=human("tick")
    )
    assert cron["thread_id"] == thread["thread_id"] and cron["schedule"] == "*/5 * * * *"
    assert cron["enabled"] is True and cron["next_run_date"]
    row = Schedule.objects.get(pk=cron["cron_id"])
    assert (row.cron, row.conversation_id, row.strategy) == (
        "0 */5 * * * *",
        thread["thread_id"],
        "enqueue",
    )
    schedules.run_now(row.id)  # one tick now: a run on the thread
    wait_for(
        lambda: (
            said(lg.threads.get_state(thread["thread_id"])["values"])[-1:] == [("ai", "Echo: tick")]
        ),
        timeout=30,
    )
    assert [c["cron_id"] for c in lg.crons.search(thread_id=thread["thread_id"])] == [row.id]
    stateless = lg.crons.create("echo", schedule="0 9 * * *", input=human("morning"))
    assert stateless["thread_id"] is None
    lg.crons.delete(stateless["cron_id"])
    assert not Schedule.objects.filter(pk=stateless["cron_id"]).exists()
    with pytest.raises(httpx.HTTPStatusError) as bad:
        lg.crons.create("echo", schedule="every day", input=human("x"))
    assert bad.value.response.status_code == 422


@pytest.mark.serial  # a cluster of its own
@pytest.mark.postgres  # a cluster's pieces of a reply reach the web process through pg_notify
def test_messages_tuple_streams_a_chat_agents_pieces_in_order(server, alice, start_cluster):
    import threading
    import time

    from ..fake_model import FakeModel, Reply, stream_answer

    connected = threading.Event()
    frames = stream_answer(["Hel", "lo, ", "wor", "ld"]).chunks

    def script(request):
        def chunks():
            connected.wait(30)  # the stream is open and listening before the first piece
            for chunk in frames:
                yield chunk
                time.sleep(0.2)  # pieces apart, as a model writes them

        return Reply(headers={"Content-Type": "text/event-stream"}, chunks=chunks())

    fake = FakeModel(script)
    try:
        start_cluster(
            MODEL_BASE_URL=fake.url, MODEL_API_KEY="sk-test", DEFAULT_MODEL="m", MODEL_RETRIES=0
        )
        lg = client_for(server, alice)
        thread = lg.threads.create()
        parts = []
        for part in lg.runs.stream(
            thread["thread_id"],
            "assistant",
            input=human("hi"),
            stream_mode=["messages-tuple", "values"],
        ):
            parts.append(part)
            if part.event == "metadata":
                connected.set()
    finally:
        connected.set()
        fake.close()
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    pieces = [c["content"] for c in chunks if c["type"] == "AIMessageChunk"]
    assert "".join(pieces) == "Hello, world" and len(pieces) >= 2
    assert chunks[-1]["type"] == "ai" and chunks[-1]["content"] == "Hello, world"  # the stored one
    assert parts[-1].event == "values"
    assert said(parts[-1].data)[-1] == ("ai", "Hello, world")


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_newer_run_under_interrupt_or_rollback_stops_the_busy_one(lg, cluster, strategy):
    thread = lg.threads.create()
    first = lg.runs.create(
        thread["thread_id"], "slow", input=human("one"), metadata={"seconds": 30}
    )
    wait_for(lambda: Run.objects.get(pk=first["run_id"]).status == "running", timeout=30)
    newer = lg.runs.create(
        thread["thread_id"],
        "slow",
        input=human("two"),
        metadata={"seconds": 0},
        multitask_strategy=strategy,
    )
    values = lg.runs.join(thread["thread_id"], newer["run_id"])
    humans = [text for kind, text in said(values) if kind == "human"]
    if strategy == "interrupt":
        assert humans == ["one", "two"]
        assert lg.runs.get(thread["thread_id"], first["run_id"])["status"] == "interrupted"
    else:
        assert humans == ["two"]  # the rolled-back run's input left the values
        with pytest.raises(httpx.HTTPStatusError) as gone:
            lg.runs.get(thread["thread_id"], first["run_id"])
        assert gone.value.response.status_code == 404


def test_the_thread_is_the_conversation_rest_shows(server, lg, alice, cluster):
    thread = lg.threads.create(graph_id="echo")
    lg.runs.wait(thread["thread_id"], "echo", input=human("over both"))
    auth = {"Authorization": f"Token {alice.token}"}
    rest = httpx.get(
        f"{server}/api/agents/conversations/{thread['thread_id']}/messages", headers=auth
    ).json()["messages"]
    assert [(m["role"], m["content"]) for m in rest] == [
        ("user", "over both"),
        ("assistant", "Echo: over both"),
    ]


def test_a_stream_served_under_asgi(asgi_server, alice, cluster):
    lg = client_for(asgi_server, alice)
    thread = lg.threads.create()
    parts = list(lg.runs.stream(thread["thread_id"], "echo", input=human("async")))
    assert parts[0].event == "metadata"
    assert said(parts[-1].data)[-1] == ("ai", "Echo: async")


@pytest.mark.serial  # clusters of its own, one killed
def test_background_runs_survive_a_sigkill_of_the_cluster(server, alice, start_cluster):
    first = start_cluster(workers=1)
    lg = client_for(server, alice)
    thread = lg.threads.create()
    busy = lg.runs.create(thread["thread_id"], "slow", input=human("nap"), metadata={"seconds": 30})
    wait_for(lambda: Run.objects.get(pk=busy["run_id"]).status == "running", timeout=30)
    queued = lg.runs.create(
        thread["thread_id"], "slow", input=human("after"), metadata={"seconds": 0}
    )
    assert queued["status"] == "pending"
    first.kill()  # SIGKILL: the running run's worker is gone, the enqueued run not started
    start_cluster(workers=1, LEASE_TIMEOUT=2, REAP_INTERVAL=1)
    values = lg.runs.join(thread["thread_id"], queued["run_id"])
    kind, text = said(values)[-1]
    assert kind == "ai" and text.startswith("Slept")  # the enqueued run ran after the restart
    # The run the kill cut ends `error` (the reaper's, as REST shows it); nothing is lost.
    assert lg.runs.get(thread["thread_id"], busy["run_id"])["status"] == "error"


def test_the_quick_start_in_the_docs_runs(server, alice, cluster):
    from ..cluster import ROOT

    doc = (ROOT / "docs" / "langgraph.md").read_text()
    snippet = doc.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("http://127.0.0.1:8000", server)
    snippet = snippet.replace("<the demo token>", alice.token)
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "docs/langgraph.md", "exec"), {})
    assert printed.getvalue().strip() == "Echo: hi"


def test_join_stream_after_a_reconnect_sends_only_what_came_after(lg, cluster):
    thread = lg.threads.create()
    run = lg.runs.create(thread["thread_id"], "slow", input=human("nap"), metadata={"seconds": 2})
    seen = None
    for part in lg.runs.join_stream(thread["thread_id"], run["run_id"], stream_mode="values"):
        if part.event == "values" and part.id:
            seen = part  # the values after the run's input: then the client goes away
            break
    assert seen is not None and said(seen.data) == [("human", "nap")]
    rest = list(
        lg.runs.join_stream(
            thread["thread_id"], run["run_id"], stream_mode="values", last_event_id=seen.id
        )
    )
    values = [p for p in rest if p.event == "values"]
    assert [said(p.data)[-1] for p in values] == [("ai", "Slept 2s")]  # nothing sent again
    assert all(int(p.id) > int(seen.id) for p in values)


def test_info_thread_search_by_status_an_interrupt_update_and_delete(lg, cluster):
    assert lg.http.get("/info")["flags"]["assistants"] is True
    idle = lg.threads.create()
    lg.runs.wait(idle["thread_id"], "echo", input=human("done"))
    waiting = lg.threads.create()
    parts = list(
        lg.runs.stream(waiting["thread_id"], "approver", input=human("prod"), stream_mode="updates")
    )
    assert "__interrupt__" in parts[-1].data
    found = {t["thread_id"] for t in lg.threads.search(status="interrupted")}
    assert found == {waiting["thread_id"]}
    assert idle["thread_id"] in {t["thread_id"] for t in lg.threads.search(status="idle")}
    updated = lg.threads.update(idle["thread_id"], metadata={"tag": "x"})
    assert updated["metadata"]["tag"] == "x" and updated["metadata"]["graph_id"] == "echo"
    lg.threads.delete(waiting["thread_id"])
    with pytest.raises(httpx.HTTPStatusError) as gone:
        lg.threads.get(waiting["thread_id"])
    assert gone.value.response.status_code == 404


def test_a_failed_run_is_an_error_in_wait_in_the_stream_and_on_the_thread(lg, cluster):
    thread = lg.threads.create()
    with pytest.raises(Exception, match="RunError: kaboom"):  # the SDK reads __error__
        lg.runs.wait(thread["thread_id"], "boom", input=human("try"))
    failed = lg.runs.wait(thread["thread_id"], "boom", input=human("try"), raise_error=False)
    assert failed["__error__"] == {"error": "RunError", "message": "kaboom"}
    assert lg.threads.get(thread["thread_id"])["status"] == "error"
    assert [r["status"] for r in lg.runs.list(thread["thread_id"])] == ["error", "error"]
    parts = list(lg.runs.stream(thread["thread_id"], "boom", input=human("again")))
    assert parts[-1].event == "error" and parts[-1].data["message"] == "kaboom"


def test_an_api_key_header_is_the_users_token(server, alice):
    keyed = get_sync_client(url=server + MOUNT, api_key=alice.token, timeout=60)
    assert keyed.threads.create()["status"] == "idle"  # the SDK sends it as X-Api-Key
    wrong = httpx.get(server + MOUNT + "/info", headers={"X-Api-Key": "nope"})
    assert wrong.status_code == 401 and wrong.json() == {"detail": "Invalid API key."}


def test_agent_chat_uis_human_in_the_loop_shape_and_its_responses(lg, cluster):
    """Agent Chat UI renders an interrupt in LangGraph's human-in-the-loop shape and resumes with
    `[{"type": "accept"}]` from the thread's head checkpoint."""
    thread = lg.threads.create()
    asked = lg.runs.wait(thread["thread_id"], "approver", input=human("prod"))
    value = asked["__interrupt__"][0]["value"]
    assert value["action_request"] == {"action": "deploy", "args": {"env": "prod"}}
    assert value["config"] == {
        "allow_accept": True,
        "allow_ignore": True,
        "allow_respond": True,
        "allow_edit": False,
    }
    head = lg.threads.get_state(thread["thread_id"])["checkpoint"]
    done = lg.runs.wait(
        thread["thread_id"],
        "approver",
        command={"resume": [{"type": "accept", "args": None}]},
        checkpoint=head,
    )
    assert said(done)[-1] == ("ai", "deployed to prod")
    lg.runs.wait(thread["thread_id"], "approver", input=human("staging"))
    denied = lg.runs.wait(
        thread["thread_id"], "approver", command={"resume": [{"type": "ignore", "args": None}]}
    )
    assert said(denied)[-1] == ("ai", "not deployed")
    with pytest.raises(httpx.HTTPStatusError) as old:  # an earlier checkpoint would fork
        lg.runs.wait(thread["thread_id"], "echo", input=human("x"), checkpoint=head)
    assert old.value.response.status_code == 422


def test_a_thread_is_copied_with_its_messages_and_config_is_kept(lg, cluster):
    from agenttasks.models import Event

    thread = lg.threads.create(metadata={"k": "v"})
    lg.runs.wait(
        thread["thread_id"],
        "echo",
        input=human("first"),
        config={"configurable": {"user_id": "u1"}},
    )
    started = Event.objects.get(conversation_id=thread["thread_id"], type="message.user")
    assert started.data["metadata"]["configurable"] == {"user_id": "u1"}  # ctx.metadata reads it
    copy = lg.threads.copy(thread["thread_id"])
    assert copy["thread_id"] != thread["thread_id"] and copy["metadata"]["k"] == "v"
    assert said(copy["values"]) == [("human", "first"), ("ai", "Echo: first")]
    after = lg.runs.wait(copy["thread_id"], "echo", input=human("second"))
    assert said(after)[-2:] == [("human", "second"), ("ai", "Echo: second")]
    assert len(said(lg.threads.get_state(thread["thread_id"])["values"])) == 2  # the original stays


def test_an_ended_runs_record_is_deleted_and_its_messages_stay(lg, cluster):
    thread = lg.threads.create()
    slow = lg.runs.create(thread["thread_id"], "slow", input=human("nap"), metadata={"seconds": 30})
    with pytest.raises(httpx.HTTPStatusError) as busy:  # not ended: cancel it first
        lg.runs.delete(thread["thread_id"], slow["run_id"])
    assert busy.value.response.status_code == 409
    lg.runs.cancel(thread["thread_id"], slow["run_id"], wait=True)
    done = lg.runs.create(thread["thread_id"], "slow", input=human("kept"), metadata={"seconds": 0})
    lg.runs.join(thread["thread_id"], done["run_id"])
    lg.runs.delete(thread["thread_id"], done["run_id"])
    with pytest.raises(httpx.HTTPStatusError) as gone:
        lg.runs.get(thread["thread_id"], done["run_id"])
    assert gone.value.response.status_code == 404
    assert ("ai", "Slept 0s") in said(lg.threads.get_state(thread["thread_id"])["values"])
