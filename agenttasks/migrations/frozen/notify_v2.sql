-- Notifications, version 2: the events of a conversation and a task's settling notify only while
-- some process listens to their channel (its row in agenttasks_listenedchannel is current; the
-- listeners of agenttasks.broker.listen renew it while their waiters wait). PostgreSQL commits
-- the transactions that notify one at a time, each with its own flush of the log, so a burst of
-- tasks that nobody followed queued every create, claim and ending on that one lock. A waiter
-- also polls, so a notification missed while a listener starts costs only the poll's delay.
-- They replace agenttasks_events_appended_v2 (events_appended_v2.sql) and
-- agenttasks_task_settled_v1 (notify_v1.sql).

-- Say whether some process listens to a channel now.
CREATE FUNCTION agenttasks_listened_v1(p_channel text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM agenttasks_listenedchannel
                    WHERE channel = p_channel AND until > now())
$$;

-- Each INSERT statement of events moves each conversation's last_seq once (by its primary key,
-- in the order of their ids) and, while agenttasks_events is listened to, notifies each
-- conversation once.
CREATE FUNCTION agenttasks_events_appended_v3() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    n record;
    v_listened boolean := agenttasks_listened_v1('agenttasks_events');
BEGIN
    FOR n IN SELECT conversation_id, max(seq) AS seq, max(created_at) AS created_at
               FROM appended GROUP BY conversation_id ORDER BY conversation_id
    LOOP
        UPDATE agenttasks_conversation
           SET last_seq = n.seq, updated_at = n.created_at
         WHERE id = n.conversation_id AND last_seq < n.seq;
        IF v_listened THEN
            PERFORM pg_notify('agenttasks_events', n.conversation_id);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended_v3();

-- A task entering a status whose entry is announced (states.NOTIFIED) wakes the status waiters
-- of other processes, while agenttasks_task_ended is listened to.
CREATE FUNCTION agenttasks_task_settled_v2() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('cancelled', 'completed', 'failed', 'waiting_for_input') AND agenttasks_listened_v1('agenttasks_task_ended') THEN
        PERFORM pg_notify('agenttasks_task_ended', NEW.id);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_task_settled ON agenttasks_task;
CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled_v2();
