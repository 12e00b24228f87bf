-- Helpers, version 1: what the create, the claims and the ending share, with the constants they
-- share with Python written in (agenttasks.sql.render). They are the helpers of migration 0005,
-- whose copies of the id format and the trigger names were written by hand.

-- A fresh id as agenttasks.ids makes one: the prefix and ids.ID_LENGTH characters of
-- ids.ALPHABET (base64's 64 symbols mapped one to one onto it).
CREATE FUNCTION agenttasks_new_id_v1(p_prefix text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT p_prefix || translate(
        left(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'),
             21),
        'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/', 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-')
$$;

-- A run's trigger as the API and run.started name it (states.trigger_name).
CREATE FUNCTION agenttasks_trigger_name_v1(p_trigger text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce('{"initial": "create"}'::jsonb ->> p_trigger, p_trigger)
$$;

-- One event, as agenttasks_append_v1 takes it. (SQL functions like this one are inlined into
-- the statements that call them.)
CREATE FUNCTION agenttasks_event_v1(
    p_conversation text, p_type text, p_data jsonb, p_run text, p_task text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'conversation_id', p_conversation, 'type', p_type, 'data', p_data,
        'run_id', coalesce(p_run, ''), 'task_id', coalesce(p_task, ''))
$$;

-- Append events to conversations whose rows the caller has locked, numbered after last_seq in
-- the order given (the event trigger then moves each conversation's last_seq).
CREATE FUNCTION agenttasks_append_v1(p_events jsonb, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agenttasks_event (id, conversation_id, seq, type, run_id, task_id, data, created_at)
    SELECT coalesce(x.event->>'id', agenttasks_new_id_v1('evt_')),
           c.id,
           c.last_seq + row_number() OVER (PARTITION BY c.id ORDER BY x.n),
           x.event->>'type',
           coalesce(x.event->>'run_id', ''),
           coalesce(x.event->>'task_id', ''),
           x.event->'data',
           p_now
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS x(event, n)
     -- One primary-key lookup per event, never a scan of the conversations (OFFSET 0 keeps the
     -- planner from turning the lateral lookup into a join).
     CROSS JOIN LATERAL (
           SELECT id, last_seq FROM agenttasks_conversation
            WHERE id = x.event->>'conversation_id' OFFSET 0) AS c;
END
$$;

-- The usage of a run as events report it, or null when unknown.
CREATE FUNCTION agenttasks_usage_v1(r agenttasks_run) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.usage_known THEN jsonb_build_object(
        'inputTokens', r.prompt_tokens, 'outputTokens', r.completion_tokens,
        'totalTokens', r.total_tokens) END
$$;

-- The run.finished event of an ended run.
CREATE FUNCTION agenttasks_run_finished_v1(r agenttasks_run) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT agenttasks_event_v1(r.conversation_id, 'run.finished', jsonb_strip_nulls(
        jsonb_build_object('status', r.status, 'error', nullif(r.error, ''),
                           'usage', agenttasks_usage_v1(r))),
        r.id, r.task_id)
$$;

-- The task.status events of a task that moved from p_previous: its own and its parent's.
CREATE FUNCTION agenttasks_status_events_v1(
    t agenttasks_task, p_previous text, p_reason text
) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    d jsonb := jsonb_strip_nulls(jsonb_build_object(
        'taskId', t.id, 'from', p_previous, 'to', t.status, 'runId', t.run_id,
        'attempt', greatest(t.attempt, 1),
        'error', CASE WHEN t.status = 'failed' THEN nullif(t.error, '') END,
        'reason', nullif(p_reason, '')));
    v_events jsonb := jsonb_build_array(
        agenttasks_event_v1(t.conversation_id, 'task.status', d, t.run_id, t.id));
BEGIN
    IF t.parent_conversation_id IS NOT NULL THEN
        v_events := v_events || jsonb_build_array(
            agenttasks_event_v1(t.parent_conversation_id, 'task.status', d, t.run_id, t.id));
    END IF;
    RETURN v_events;
END
$$;

-- Close the open actions of a run that ends; return their action.resolved events.
CREATE FUNCTION agenttasks_cancel_actions_v1(p_run_id text, p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_events jsonb;
BEGIN
    WITH closed AS (
        UPDATE agenttasks_pendingaction SET status = 'cancelled', decided_at = p_now
         WHERE run_id = p_run_id AND status = 'pending'
        RETURNING id, kind, conversation_id, task_id, created_at
    )
    SELECT coalesce(jsonb_agg(agenttasks_event_v1(conversation_id, 'action.resolved',
               jsonb_build_object('actionId', id, 'kind', kind, 'status', 'cancelled'),
               p_run_id, task_id) ORDER BY created_at, id), '[]'::jsonb)
      INTO v_events
      FROM closed;
    RETURN v_events;
END
$$;

-- Record how a locked running or paused run ended; return the events it appends.
CREATE FUNCTION agenttasks_record_end_v1(r agenttasks_run, o jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_events jsonb := '[]';
    v_counts jsonb := o->'usage';
    v_message jsonb;
BEGIN
    IF r.status = 'paused' AND o->>'status' <> 'input_required' THEN
        v_events := agenttasks_cancel_actions_v1(r.id, p_now);
    END IF;
    IF jsonb_typeof(v_counts) = 'array' THEN
        r.usage_known := true;
        r.prompt_tokens := (v_counts->>0)::integer;
        r.completion_tokens := (v_counts->>1)::integer;
        r.total_tokens := (v_counts->>2)::integer;
    END IF;
    IF o->>'text' <> '' AND (o->>'append_message')::boolean THEN
        v_message := jsonb_build_object('content', o->>'text');
        IF jsonb_typeof(v_counts) = 'array' THEN
            v_message := v_message || jsonb_build_object('usage', agenttasks_usage_v1(r));
        END IF;
        v_events := v_events || jsonb_build_array(agenttasks_event_v1(
            r.conversation_id, 'message.assistant', v_message, r.id, r.task_id));
    END IF;
    IF r.stop_request = 'now' THEN
        -- Told to stop now: whatever it reports afterwards is a late ending, discarded.
        r.status := 'cancelled';
        r.error := '';
    ELSE
        r.status := CASE WHEN o->>'status' IN ('completed', 'failed', 'cancelled')
                         THEN o->>'status' ELSE 'completed' END;
        r.error := CASE WHEN r.status = 'failed' THEN o->>'error' ELSE '' END;
    END IF;
    UPDATE agenttasks_run
       SET status = r.status, error = r.error, output = o->>'text',
           graceful_stop = (o->>'graceful_stop')::boolean, ended_at = p_now,
           usage_known = r.usage_known, prompt_tokens = r.prompt_tokens,
           completion_tokens = r.completion_tokens, total_tokens = r.total_tokens
     WHERE id = r.id;
    RETURN v_events || jsonb_build_array(agenttasks_run_finished_v1(r));
END
$$;
