-- Notifications, version 1: the triggers that tell other processes of a commit, on the
-- channels agenttasks.listen and agenttasks.queue listen to (their names written in by
-- agenttasks.sql.render). They replace the functions of migrations 0002 and 0006, which
-- wrote the channels and the statuses by hand.

-- Each INSERT statement of events moves each conversation's last_seq once and notifies each
-- conversation once, however many events it appends.
CREATE FUNCTION agenttasks_events_appended_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agenttasks_conversation c
       SET last_seq = n.seq, updated_at = n.created_at
      FROM (SELECT conversation_id, max(seq) AS seq, max(created_at) AS created_at
              FROM appended GROUP BY conversation_id) n
     WHERE c.id = n.conversation_id AND c.last_seq < n.seq;
    PERFORM pg_notify('agenttasks_events', conversation_id)
       FROM (SELECT DISTINCT conversation_id FROM appended) d;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended_v1();

-- A run told to stop wakes the worker process that holds it.
CREATE FUNCTION agenttasks_run_stop_requested_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agenttasks_run_stop', NEW.id);
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_run_stop_requested ON agenttasks_run;
CREATE TRIGGER agenttasks_run_stop_requested
    AFTER UPDATE OF stop_request ON agenttasks_run
    FOR EACH ROW WHEN (NEW.stop_request <> '' AND OLD.stop_request IS DISTINCT FROM NEW.stop_request)
    EXECUTE FUNCTION agenttasks_run_stop_requested_v1();

-- A task entering a status whose entry is announced (states.NOTIFIED) wakes the status
-- waiters of other processes.
CREATE FUNCTION agenttasks_task_settled_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('cancelled', 'completed', 'failed', 'waiting_for_input') THEN
        PERFORM pg_notify('agenttasks_task_ended', NEW.id);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_task_settled ON agenttasks_task;
CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled_v1();
