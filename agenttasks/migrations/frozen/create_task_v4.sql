-- Create a task, version 4: its conversation, first run and task rows and their first events,
-- unless the user's active-task limit or the parent conversation's cap refuses it. Returns
-- 'created', 'owner_limit', 'parent_gone' or 'parent_cap'. Lock order: the user's advisory lock,
-- then the parent conversation. The first run's django-q2 job is written when p_job is one, and
-- with p_notify the transaction notifies the worker processes that listen (delivered at commit).
-- Version 4 is version 3 on the helpers of helpers_v1.sql. The live statuses, the queue table
-- and the channel are written in from Python (agenttasks.sql.render).
CREATE FUNCTION agenttasks_create_task_v4(
    p_conversation jsonb, p_run jsonb, p_task jsonb, p_events jsonb,
    p_owner_limit integer, p_parent_cap integer, p_job jsonb, p_notify boolean
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
    PERFORM agenttasks_append_v1(p_events, (p_task->>'created_at')::timestamptz);
    IF jsonb_typeof(p_job) = 'object' THEN
        INSERT INTO django_q_ormq (key, payload, lock)
        VALUES (p_job->>'key', p_job->>'payload', (p_job->>'lock')::timestamptz);
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('agenttasks_runs', '');
    END IF;
    RETURN 'created';
END
$$;
