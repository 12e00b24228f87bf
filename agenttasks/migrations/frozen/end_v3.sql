-- End a run, version 3: version 2, and when the ending settles its task in a notified status
-- (states.NOTIFIED) its answer also carries what the ending's effects asked in statements of
-- their own after the commit: "messages_wait" (messages wait to re-open the task: a run waiting
-- its turn, or steered messages that a run which ended did not read; lifecycle/effects.py) and
-- "push_configs" (the ids of the task's A2A push configs, whose deliveries the ending owes;
-- a2a/notify.py). Both are read under the task's row lock, so they are exact: a message sent
-- after the commit finds the task settled and re-opens it itself, and a config set after it is
-- owed nothing by this ending.
CREATE FUNCTION agenttasks_end_v3(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_answer jsonb := agenttasks_end_v2(p);
    v_task_id text := v_answer->'task'->>'id';
BEGIN
    IF v_task_id IS NULL OR v_answer->'task'->>'status' NOT IN ('cancelled', 'completed', 'failed', 'waiting_for_input') THEN
        RETURN v_answer;
    END IF;
    RETURN v_answer || jsonb_build_object(
        'messages_wait', EXISTS (
            SELECT 1 FROM agenttasks_run
             WHERE task_id = v_task_id
               AND (status = 'waiting' OR (status IN ('cancelled', 'completed', 'failed', 'interrupted', 'rolled_back') AND steers > steers_taken))),
        'push_configs', (
            SELECT coalesce(jsonb_agg(id ORDER BY id), '[]') FROM agenttasks_a2apushconfig
             WHERE task_id = v_task_id));
END
$$;
