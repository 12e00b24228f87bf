-- The deliveries an ending owes, version 1: when a task enters a notified status (NOTIFIED in
-- agenttasks/states.py, put in place of 'cancelled', 'completed', 'failed', 'waiting_for_input' by the migration), the same statement records
-- its callback (when it has a callbackUrl) and one POST per A2A push config as outbox rows, which
-- the jobs delete as they claim them and the reaper sends again while they stay overdue.
CREATE FUNCTION agenttasks_owe_deliveries_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agenttasks_delivery (task_id, config_id, status, version, attempts, due_at)
    SELECT NEW.id, NULL, NEW.status, NEW.version, 0, NEW.updated_at
     WHERE NEW.callback_url <> ''
    UNION ALL
    SELECT NEW.id, config.id, NEW.status, NEW.version, 0, NEW.updated_at
      FROM agenttasks_a2apushconfig AS config
     WHERE config.task_id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER agenttasks_owe_deliveries AFTER UPDATE OF status ON agenttasks_task
FOR EACH ROW WHEN (NEW.status IN ('cancelled', 'completed', 'failed', 'waiting_for_input') AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION agenttasks_owe_deliveries_v1();
