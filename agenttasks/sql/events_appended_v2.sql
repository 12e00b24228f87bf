-- The trigger of appended events, version 2: each INSERT statement of events moves each
-- conversation's last_seq once and notifies each conversation once, however many events it
-- appends. Version 1 joined the appended events with the conversations in one UPDATE; a
-- connection keeps the plan it made when the table was small, and that plan read every
-- conversation for each append (a hash join over a sequential scan). Version 2 updates each
-- conversation by its primary key (a statement appends to one or two), in the order of their
-- ids.
CREATE FUNCTION agenttasks_events_appended_v2() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    n record;
BEGIN
    FOR n IN SELECT conversation_id, max(seq) AS seq, max(created_at) AS created_at
               FROM appended GROUP BY conversation_id ORDER BY conversation_id
    LOOP
        UPDATE agenttasks_conversation
           SET last_seq = n.seq, updated_at = n.created_at
         WHERE id = n.conversation_id AND last_seq < n.seq;
        PERFORM pg_notify(:events_channel, n.conversation_id);
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended_v2();
