-- Tasks by status, version 2: as version 1 (migration 0012), with 256 shards instead of 8 (each
-- connection writes the shard of its backend pid, so hundreds of runs ending at once rarely wait
-- for one another's count rows), and each statement takes its rows' locks in the order of their
-- status, so two transactions of one shard (a claim of many runs and an ending, say) wait for
-- each other, never deadlock. The rows of version 1's shards keep counting in the sums.
CREATE FUNCTION agenttasks_count_tasks_v2() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM agenttasks_taskcount;
        RETURN NULL;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO agenttasks_taskcount (status, shard, n)
        SELECT status, pg_backend_pid() % 256, count(*) FROM counted_new
         GROUP BY status ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = agenttasks_taskcount.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO agenttasks_taskcount (status, shard, n)
        SELECT status, pg_backend_pid() % 256, -count(*) FROM counted_old
         GROUP BY status ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = agenttasks_taskcount.n + excluded.n;
    ELSE
        INSERT INTO agenttasks_taskcount (status, shard, n)
        SELECT status, pg_backend_pid() % 256, sum(change) FROM (
            SELECT status, 1 AS change FROM counted_new
            UNION ALL
            SELECT status, -1 FROM counted_old
        ) AS changes
        GROUP BY status
        HAVING sum(change) <> 0
        ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = agenttasks_taskcount.n + excluded.n;
    END IF;
    RETURN NULL;
END;
$$;
CREATE OR REPLACE TRIGGER agenttasks_task_counted_insert AFTER INSERT ON agenttasks_task
    REFERENCING NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
CREATE OR REPLACE TRIGGER agenttasks_task_counted_update AFTER UPDATE ON agenttasks_task
    REFERENCING OLD TABLE AS counted_old NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
CREATE OR REPLACE TRIGGER agenttasks_task_counted_delete AFTER DELETE ON agenttasks_task
    REFERENCING OLD TABLE AS counted_old
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
CREATE OR REPLACE TRIGGER agenttasks_task_counted_truncate AFTER TRUNCATE ON agenttasks_task
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
