-- A task's changes, version 1: one row trigger where an update of its status fired four (the
-- transition check of task_transitions_v1.sql, the status counters of task_counts_v2.sql, the
-- deliveries of deliveries_v1.sql and the settling's notification of notify_v2.sql), and an
-- insert's count without a transition table. Each of those cost its own call, and the counters'
-- statement trigger captured every updated row, status changed or not, in two transition tables:
-- in psql, 2,000 endings' updates of one task each took 270 µs apiece, 200 µs now. Deletes and
-- truncations stay counted by agenttasks_count_tasks_v2, a statement at a time.
CREATE FUNCTION agenttasks_task_changed_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agenttasks_taskcount (status, shard, n)
        VALUES (NEW.status, pg_backend_pid() % 256, 1)
        ON CONFLICT (status, shard) DO UPDATE SET n = agenttasks_taskcount.n + 1;
        RETURN NULL;
    END IF;
    -- An update that moved the status (the trigger's WHEN) to one that TRANSITIONS allows
    -- (agenttasks/states.py, whose pairs the template's placeholder became); raised after the
    -- row is written, the error still undoes the statement.
    IF NOT (OLD.status || '>' || NEW.status) = ANY (ARRAY['cancelled>pending', 'completed>pending', 'failed>pending', 'pending>cancelled', 'pending>completed', 'pending>failed', 'pending>pending', 'pending>running', 'running>cancelled', 'running>completed', 'running>failed', 'running>pending', 'running>waiting_for_input', 'waiting_for_input>cancelled', 'waiting_for_input>completed', 'waiting_for_input>failed', 'waiting_for_input>pending']) THEN
        RAISE EXCEPTION 'tasks: % -> % is not an allowed transition', OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    -- The two counters in the order of their status, as every writer of them takes their locks.
    INSERT INTO agenttasks_taskcount (status, shard, n)
    SELECT status, pg_backend_pid() % 256, change
      FROM (VALUES (OLD.status, -1), (NEW.status, 1)) AS changes (status, change)
     ORDER BY status
    ON CONFLICT (status, shard) DO UPDATE SET n = agenttasks_taskcount.n + excluded.n;
    IF NEW.status IN ('cancelled', 'completed', 'failed', 'waiting_for_input') THEN
        -- The deliveries the ending owes: its callback and one POST per A2A push config.
        INSERT INTO agenttasks_delivery (task_id, config_id, status, version, attempts, due_at)
        SELECT NEW.id, NULL, NEW.status, NEW.version, 0, NEW.updated_at
         WHERE NEW.callback_url <> ''
        UNION ALL
        SELECT NEW.id, config.id, NEW.status, NEW.version, 0, NEW.updated_at
          FROM agenttasks_a2apushconfig AS config
         WHERE config.task_id = NEW.id;
        IF agenttasks_listened_v1('agenttasks_task_ended') THEN
            PERFORM pg_notify('agenttasks_task_ended', NEW.id);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_task_transition ON agenttasks_task;
DROP TRIGGER agenttasks_task_counted_update ON agenttasks_task;
DROP TRIGGER agenttasks_task_counted_insert ON agenttasks_task;
DROP TRIGGER agenttasks_owe_deliveries ON agenttasks_task;
DROP TRIGGER agenttasks_task_settled ON agenttasks_task;
CREATE TRIGGER agenttasks_task_changed
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_changed_v1();
CREATE TRIGGER agenttasks_task_inserted
    AFTER INSERT ON agenttasks_task
    FOR EACH ROW EXECUTE FUNCTION agenttasks_task_changed_v1();
