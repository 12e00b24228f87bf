-- The transition table on every writer, version 1: refuse a change of agenttasks_task.status
-- that TRANSITIONS in agenttasks/states.py does not allow (docs/architecture.md#task-transitions).
-- The migration puts the allowed 'from>to' pairs of that table in place of 'cancelled>pending', 'completed>pending', 'failed>pending', 'pending>cancelled', 'pending>completed', 'pending>failed', 'pending>pending', 'pending>running', 'running>cancelled', 'running>completed', 'running>failed', 'running>pending', 'running>waiting_for_input', 'waiting_for_input>cancelled', 'waiting_for_input>completed', 'waiting_for_input>failed', 'waiting_for_input>pending', so the SQL
-- functions and the ORM are checked against the one table.
CREATE FUNCTION agenttasks_task_transition_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (OLD.status || '>' || NEW.status) = ANY (ARRAY['cancelled>pending', 'completed>pending', 'failed>pending', 'pending>cancelled', 'pending>completed', 'pending>failed', 'pending>pending', 'pending>running', 'running>cancelled', 'running>completed', 'running>failed', 'running>pending', 'running>waiting_for_input', 'waiting_for_input>cancelled', 'waiting_for_input>completed', 'waiting_for_input>failed', 'waiting_for_input>pending']) THEN
        RAISE EXCEPTION 'tasks: % -> % is not an allowed transition', OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER agenttasks_task_transition
    BEFORE UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_transition_v1();
