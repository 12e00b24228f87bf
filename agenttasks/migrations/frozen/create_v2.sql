-- Create a task, version 2: version 1 (agenttasks_create_task, migration 0005), and with
-- p_notify the same transaction notifies `agenttasks_runs` (delivered at commit), so worker
-- processes that listen claim the new run at once and the run needs no django-q2 job.
CREATE FUNCTION agenttasks_create_task_v2(
    p_conversation jsonb, p_run jsonb, p_task jsonb, p_events jsonb,
    p_owner_limit integer, p_parent_cap integer, p_job jsonb, p_notify boolean
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_verdict text;
BEGIN
    v_verdict := agenttasks_create_task(
        p_conversation, p_run, p_task, p_events, p_owner_limit, p_parent_cap, p_job);
    IF v_verdict = 'created' AND p_notify THEN
        PERFORM pg_notify('agenttasks_runs', '');
    END IF;
    RETURN v_verdict;
END
$$;
