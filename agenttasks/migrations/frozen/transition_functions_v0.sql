-- A fresh id like agenttasks.ids: the prefix and 21 characters of the URL-safe alphabet.
CREATE OR REPLACE FUNCTION agenttasks_new_id(p_prefix text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN p_prefix || translate(
        left(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'), 21),
        '+/', '-_');
END
$$;

-- One event, as agenttasks_append takes it. (STABLE SQL expressions like this one are inlined
-- into the statements that call them.)
CREATE OR REPLACE FUNCTION agenttasks_event(
    p_conversation text, p_type text, p_data jsonb, p_run text, p_task text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'conversation_id', p_conversation, 'type', p_type, 'data', p_data,
        'run_id', coalesce(p_run, ''), 'task_id', coalesce(p_task, ''))
$$;

-- Append events to conversations whose rows the caller has locked, numbered after last_seq in
-- the order given (the event trigger then moves each conversation's last_seq).
CREATE OR REPLACE FUNCTION agenttasks_append(p_events jsonb, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agenttasks_event (id, conversation_id, seq, type, run_id, task_id, data, created_at)
    SELECT coalesce(x.event->>'id', agenttasks_new_id('evt_')),
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
CREATE OR REPLACE FUNCTION agenttasks_usage(r agenttasks_run) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.usage_known THEN jsonb_build_object(
        'inputTokens', r.prompt_tokens, 'outputTokens', r.completion_tokens,
        'totalTokens', r.total_tokens) END
$$;

-- The run.finished event of an ended run.
CREATE OR REPLACE FUNCTION agenttasks_run_finished(r agenttasks_run) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT agenttasks_event(r.conversation_id, 'run.finished', jsonb_strip_nulls(jsonb_build_object(
        'status', r.status, 'error', nullif(r.error, ''), 'usage', agenttasks_usage(r))),
        r.id, r.task_id)
$$;

-- The task.status events of a task that moved from p_previous: its own and its parent's.
CREATE OR REPLACE FUNCTION agenttasks_status_events(
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
        agenttasks_event(t.conversation_id, 'task.status', d, t.run_id, t.id));
BEGIN
    IF t.parent_conversation_id IS NOT NULL THEN
        v_events := v_events || jsonb_build_array(
            agenttasks_event(t.parent_conversation_id, 'task.status', d, t.run_id, t.id));
    END IF;
    RETURN v_events;
END
$$;

-- Close the open actions of a run that ends; return their action.resolved events.
CREATE OR REPLACE FUNCTION agenttasks_cancel_actions(p_run_id text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_events jsonb;
BEGIN
    WITH closed AS (
        UPDATE agenttasks_pendingaction SET status = 'cancelled', decided_at = p_now
         WHERE run_id = p_run_id AND status = 'pending'
        RETURNING id, kind, conversation_id, task_id, created_at
    )
    SELECT coalesce(jsonb_agg(agenttasks_event(conversation_id, 'action.resolved',
               jsonb_build_object('actionId', id, 'kind', kind, 'status', 'cancelled'),
               p_run_id, task_id) ORDER BY created_at, id), '[]'::jsonb)
      INTO v_events
      FROM closed;
    RETURN v_events;
END
$$;

-- Record how a locked running or paused run ended; return the events it appends.
CREATE OR REPLACE FUNCTION agenttasks_record_end(r agenttasks_run, o jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_events jsonb := '[]';
    v_counts jsonb := o->'usage';
    v_message jsonb;
BEGIN
    IF r.status = 'paused' AND o->>'status' <> 'input_required' THEN
        v_events := agenttasks_cancel_actions(r.id, p_now);
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
            v_message := v_message || jsonb_build_object('usage', agenttasks_usage(r));
        END IF;
        v_events := v_events || jsonb_build_array(agenttasks_event(
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
    RETURN v_events || jsonb_build_array(agenttasks_run_finished(r));
END
$$;

-- Create a task with its conversation, first run, events and (ORM broker) job, unless the
-- user's active-task limit or the parent conversation's cap refuses it. Returns 'created',
-- 'owner_limit', 'parent_gone' or 'parent_cap'. Lock order: the user's advisory lock, then the
-- parent conversation.
CREATE OR REPLACE FUNCTION agenttasks_create_task(
    p_conversation jsonb, p_run jsonb, p_task jsonb, p_events jsonb,
    p_owner_limit integer, p_parent_cap integer, p_job jsonb
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_owner text := p_task->>'owner_id';
    v_parent_id text := p_task->>'parent_conversation_id';
    v_parent agenttasks_conversation;
BEGIN
    IF p_owner_limit > 0 AND v_owner IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('agenttasks:principal:' || v_owner, 0));
        IF (SELECT count(*) FROM agenttasks_task t
              JOIN agenttasks_conversation c ON c.id = t.conversation_id
             WHERE t.owner_id = v_owner::integer
               AND t.status IN ('pending', 'running', 'waiting_for_input')
               AND t.kind <> 'delegate' AND c.deleting_at IS NULL) >= p_owner_limit THEN
            RETURN 'owner_limit';
        END IF;
    END IF;
    IF v_parent_id IS NOT NULL THEN
        SELECT * INTO v_parent FROM agenttasks_conversation
         WHERE id = v_parent_id FOR NO KEY UPDATE;
        IF NOT FOUND OR v_parent.deleting_at IS NOT NULL THEN
            RETURN 'parent_gone';
        END IF;
        IF p_parent_cap > 0 AND (SELECT count(*) FROM agenttasks_task
              WHERE parent_conversation_id = v_parent_id
                AND status IN ('pending', 'running', 'waiting_for_input')
                AND kind <> 'delegate') >= p_parent_cap THEN
            RETURN 'parent_cap';
        END IF;
    END IF;
    INSERT INTO agenttasks_conversation
        SELECT * FROM jsonb_populate_record(NULL::agenttasks_conversation, p_conversation);
    INSERT INTO agenttasks_run
        SELECT * FROM jsonb_populate_record(NULL::agenttasks_run, p_run);
    INSERT INTO agenttasks_task
        SELECT * FROM jsonb_populate_record(NULL::agenttasks_task, p_task);
    PERFORM agenttasks_append(p_events, (p_task->>'created_at')::timestamptz);
    IF jsonb_typeof(p_job) = 'object' THEN
        INSERT INTO django_q_ormq (key, payload, lock)
        VALUES (p_job->>'key', p_job->>'payload', (p_job->>'lock')::timestamptz);
    END IF;
    RETURN 'created';
END
$$;

-- Claim a queued run for a worker: the run (and its task) move to running. Returns the task,
-- run and conversation as written, {"missing": true} for an unknown run, or null when this run
-- is not the one to run. Lock order: task, conversation, run, parent conversation; a run without
-- a task: its conversation, then the run.
CREATE OR REPLACE FUNCTION agenttasks_claim_run(p_run_id text, p_worker text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    t agenttasks_task;
    c agenttasks_conversation;
    r agenttasks_run;
    v_events jsonb := '[]';
BEGIN
    SELECT * INTO t FROM agenttasks_task WHERE run_id = p_run_id FOR NO KEY UPDATE;
    IF FOUND THEN
        SELECT * INTO c FROM agenttasks_conversation WHERE id = t.conversation_id
           FOR NO KEY UPDATE;
        SELECT * INTO r FROM agenttasks_run WHERE id = p_run_id FOR NO KEY UPDATE;
        IF r.status <> 'queued' OR t.status <> 'pending' OR c.deleting_at IS NOT NULL THEN
            RETURN NULL;
        END IF;
        IF t.parent_conversation_id IS NOT NULL THEN
            PERFORM 1 FROM agenttasks_conversation WHERE id = t.parent_conversation_id
               FOR NO KEY UPDATE;
        END IF;
        IF r.started_at IS NULL THEN
            v_events := jsonb_build_array(agenttasks_event(c.id, 'run.started',
                jsonb_build_object(
                    'trigger', CASE WHEN r.trigger = 'initial' THEN 'create' ELSE r.trigger END,
                    'attempt', r.attempt),
                r.id, t.id));
        END IF;
        UPDATE agenttasks_run
           SET status = 'running', worker = p_worker, heartbeat_at = p_now,
               started_at = coalesce(started_at, p_now)
         WHERE id = p_run_id RETURNING * INTO r;
        UPDATE agenttasks_task
           SET status = 'running', started_at = coalesce(started_at, p_now),
               updated_at = p_now, version = version + 1
         WHERE id = t.id RETURNING * INTO t;
        PERFORM agenttasks_append(v_events || agenttasks_status_events(t, 'pending', ''), p_now);
        RETURN jsonb_build_object('task', to_jsonb(t), 'run', to_jsonb(r), 'conversation', to_jsonb(c));
    END IF;
    -- A run without a task (or one its task has left).
    SELECT * INTO c FROM agenttasks_conversation
     WHERE id = (SELECT conversation_id FROM agenttasks_run WHERE id = p_run_id)
       FOR NO KEY UPDATE;
    SELECT * INTO r FROM agenttasks_run WHERE id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('missing', true);
    END IF;
    IF r.status <> 'queued' THEN
        RETURN NULL;
    END IF;
    IF r.task_id IS NOT NULL OR c.deleting_at IS NOT NULL THEN
        -- Housekeeping: a queued run its task left (or on a dying conversation) never runs.
        UPDATE agenttasks_run SET status = 'cancelled', ended_at = p_now, error = ''
         WHERE id = p_run_id;
        RETURN NULL;
    END IF;
    IF r.started_at IS NULL THEN
        v_events := jsonb_build_array(agenttasks_event(c.id, 'run.started',
            jsonb_build_object('trigger', r.trigger), r.id, ''));
    END IF;
    UPDATE agenttasks_run
       SET status = 'running', worker = p_worker, heartbeat_at = p_now,
           started_at = coalesce(started_at, p_now)
     WHERE id = p_run_id RETURNING * INTO r;
    PERFORM agenttasks_append(v_events, p_now);
    RETURN jsonb_build_object('run', to_jsonb(r), 'conversation', to_jsonb(c));
END
$$;

-- store.end as one statement: record how a run ended (p->'outcome') and settle its task with
-- p->'ending' (p->'after_turn' instead when the run was asked to stop after its turn). Returns
-- {"recorded", "task", "run", "conversation", "conversations"}, or {"missing": true}. Lock order:
-- task, conversation, run, parent conversation, then actions and wake-ups.
CREATE OR REPLACE FUNCTION agenttasks_end(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := (p->>'now')::timestamptz;
    v_run_id text := p->>'run_id';
    v_outcome jsonb := p->'outcome';
    v_ending jsonb := p->'ending';
    v_cutoff timestamptz := (p->>'lease_cutoff')::timestamptz;
    t agenttasks_task;
    c agenttasks_conversation;
    r agenttasks_run;
    v_events jsonb := '[]';
    v_recorded boolean := false;
    v_previous text;
    v_status text;
    v_error text;
    v_result jsonb;
BEGIN
    SELECT * INTO t FROM agenttasks_task WHERE id = p->>'task_id' FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('missing', true);
    END IF;
    SELECT * INTO c FROM agenttasks_conversation WHERE id = t.conversation_id FOR NO KEY UPDATE;
    IF t.run_id <> v_run_id THEN
        -- The task has moved to another run: only this run's own ending is recorded.
        IF v_outcome IS NOT NULL THEN
            SELECT * INTO r FROM agenttasks_run WHERE id = v_run_id FOR NO KEY UPDATE;
            IF FOUND AND r.status IN ('running', 'paused') THEN
                PERFORM agenttasks_append(agenttasks_record_end(r, v_outcome, v_now), v_now);
                v_recorded := true;
            END IF;
        END IF;
        RETURN jsonb_build_object('recorded', v_recorded,
            'conversations', CASE WHEN v_recorded THEN jsonb_build_array(c.id) ELSE '[]' END);
    END IF;
    SELECT * INTO r FROM agenttasks_run WHERE id = t.run_id FOR NO KEY UPDATE;
    IF v_cutoff IS NOT NULL AND NOT coalesce(
        t.status = 'running' AND r.status = 'running' AND c.deleting_at IS NULL
        AND coalesce(r.heartbeat_at, r.started_at) < v_cutoff, false
    ) THEN
        RETURN jsonb_build_object('recorded', false);
    END IF;
    v_recorded := v_outcome IS NOT NULL AND r.status IN ('running', 'paused');
    IF NOT v_recorded AND t.status NOT IN ('pending', 'running', 'waiting_for_input') THEN
        RETURN jsonb_build_object('recorded', false);
    END IF;
    IF t.parent_conversation_id IS NOT NULL THEN
        PERFORM 1 FROM agenttasks_conversation WHERE id = t.parent_conversation_id
           FOR NO KEY UPDATE;
    END IF;
    IF v_recorded THEN
        v_events := agenttasks_record_end(r, v_outcome, v_now);
        SELECT * INTO r FROM agenttasks_run WHERE id = r.id;
    END IF;
    IF p ? 'after_turn' AND r.stop_request = 'after_turn' THEN
        v_ending := p->'after_turn';
    END IF;
    IF t.status NOT IN ('pending', 'running', 'waiting_for_input') THEN
        PERFORM agenttasks_append(v_events, v_now);
        RETURN jsonb_build_object('recorded', v_recorded, 'conversations', jsonb_build_array(c.id));
    END IF;
    v_status := v_ending->>'status';
    v_error := CASE WHEN v_status = 'failed'
                    THEN coalesce(nullif(v_ending->>'error', ''), v_ending->>'result', '')
                    ELSE '' END;
    IF r.status IN ('queued', 'paused') THEN
        IF r.status = 'paused' THEN
            v_events := v_events || agenttasks_cancel_actions(r.id, v_now);
        END IF;
        UPDATE agenttasks_run SET status = v_status, ended_at = v_now, error = v_error
         WHERE id = r.id RETURNING * INTO r;
        v_events := v_events || jsonb_build_array(agenttasks_run_finished(r));
    ELSIF r.status = 'running' AND r.stop_request <> 'now' THEN
        -- Ended from outside (a stop, the reaper, a timeout): the worker aborts.
        UPDATE agenttasks_run SET stop_request = 'now' WHERE id = r.id RETURNING * INTO r;
    END IF;
    v_previous := t.status;
    UPDATE agenttasks_task
       SET status = v_status,
           summary = coalesce(nullif(v_ending->>'summary', ''), summary),
           result = coalesce(nullif(v_ending->>'result', ''), result),
           error = v_error,
           state = CASE WHEN v_ending ? 'state' THEN v_ending->'state' ELSE state END,
           stop_reason = coalesce(v_ending->>'reason', ''),
           finished_at = v_now,
           attempt = CASE WHEN (p->>'rollback_attempt')::boolean
                          THEN greatest(attempt - 1, 1) ELSE attempt END,
           updated_at = v_now,
           version = version + 1
     WHERE id = t.id RETURNING * INTO t;
    v_result := v_ending->'task_result';
    IF jsonb_typeof(v_result) = 'object' THEN
        INSERT INTO agenttasks_taskresult
               (id, task_id, run_id, content, partial, files, metadata, usage, created_at)
        VALUES (agenttasks_new_id('taskres_'), t.id, v_run_id, v_result->>'content',
                (v_result->>'partial')::boolean, v_result->'files', v_result->'metadata',
                nullif(v_result->'usage', 'null'::jsonb), v_now)
        ON CONFLICT (task_id) DO UPDATE
           SET run_id = EXCLUDED.run_id, content = EXCLUDED.content,
               partial = EXCLUDED.partial, files = EXCLUDED.files,
               metadata = EXCLUDED.metadata, usage = EXCLUDED.usage,
               created_at = EXCLUDED.created_at;
    END IF;
    IF v_status <> 'cancelled' AND t.parent_conversation_id IS NOT NULL
       AND t.kind <> 'delegate' THEN
        -- The result this ending owes the parent conversation.
        INSERT INTO agenttasks_wakeup
               (id, conversation_id, task_id, run_id, status, label, summary, truncated, state,
                created_at)
        VALUES (agenttasks_new_id('wake_'), t.parent_conversation_id, t.id, v_run_id, v_status,
                t.label, t.summary, octet_length(t.result) > octet_length(t.summary), 'pending',
                v_now);
    END IF;
    v_events := v_events || agenttasks_status_events(t, v_previous, v_ending->>'reason');
    PERFORM agenttasks_append(v_events, v_now);
    RETURN jsonb_build_object(
        'recorded', v_recorded, 'task', to_jsonb(t), 'run', to_jsonb(r),
        'conversation', to_jsonb(c),
        'conversations', jsonb_build_array(c.id, t.parent_conversation_id));
END
$$;
