-- Events, version 2: append events to one conversation in one statement. Locks the
-- conversation's row, then numbers the events after its last_seq (agenttasks_append_v1). Answers
-- false when there is no such conversation. Version 2 is version 1 on helpers_v1.sql.
CREATE FUNCTION agenttasks_append_to_v2(
    p_conversation text, p_events jsonb, p_now timestamptz
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM agenttasks_conversation WHERE id = p_conversation FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM agenttasks_append_v1(p_events, p_now);
    RETURN true;
END
$$;
