-- End a run, version 1: store.end as one statement. Record how a run ended (p->'outcome') and
-- settle its task with p->'ending' (p->'after_turn' instead when the run was asked to stop after
-- its turn). Returns {"recorded", "task", "run", "conversation", "conversations"}, or
-- {"missing": true} for an unknown task; an unknown old run records nothing ("recorded": false),
-- as the ORM path answers. Lock order: task, conversation, run, parent conversation, then
-- actions and wake-ups. It is agenttasks_end of migration 0005, the live statuses written in
-- from Python (agenttasks.sql.render).
CREATE FUNCTION agenttasks_end_v1(p jsonb) RETURNS jsonb
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
