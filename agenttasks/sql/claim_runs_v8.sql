-- Claims, version 8 of the claim of several runs (docs/architecture.md#in-flight-runs): a run
-- whose not_before has not come is left queued, and the queued runs are taken fairly: wake-up
-- runs of parents first (they finish what has begun), then owner by owner (each owner's best
-- run, then each owner's second, ...), a higher priority first within an owner's share and
-- between owners' runs of the same rank, then the oldest. p_per_owner (0: none): an owner with
-- that many runs of tasks running gets no more of them until one ends (the runs named in
-- p_first, which their callers wait on, and runs without a task are not held back); and
-- p_agent_room ({agent: n}): no more than n runs of that agent are taken in fair order (its model
-- endpoint's line of turns has room for n more), the runs of the agent claimed by this call
-- counted. Answers {"claims": [...], "passed": n, "next_at": t}: next_at is the earliest
-- not_before still to come (null when none), so the claimer knows when to look again.
-- Version 6 makes p_per_owner hard: its claims take turns (a transaction-level advisory lock),
-- so each one's looks see the runs the claim before it took.
-- Version 7 reads the owner and the priority the run carries (agenttasks_run.owner_id and
-- .priority), and walks agenttasks_run_turn_idx owner by owner, a few runs of each, instead of
-- ranking every queued run: version 6's look read and sorted the whole queue, about 10 ms a
-- claim with 1,000 runs queued. A wake-up's share is counted among the wake-ups only. And it
-- runs on generic plans (plan_cache_mode, for the claims it calls too): on array parameters
-- PostgreSQL kept planning each statement of a claim anew on every call, about 2 ms a claim.
-- Version 8 runs with enable_seqscan off (for the claims it calls too). A connection makes a
-- claim's generic plans once, and those made while the tables were small read them whole (the
-- runs not yet started, with no index to go by: a scan of the run table at every claim, for
-- the connection's life); every statement of a claim has an index to go by.
CREATE FUNCTION agenttasks_claim_runs_v8(
    p_worker text, p_limit integer, p_now timestamptz, p_first text[], p_per_owner integer,
    p_agent_room jsonb
) RETURNS jsonb
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    v_claimed jsonb := '[]';
    v_round jsonb;
    v_passed integer := 0;
    v_seen text[] := coalesce(p_first, '{}');
    v_ids text[];
    v_delegates boolean := true;
    v_id text;
    v_answer jsonb;
    v_wanted integer := 0;  -- how many due runs the last look asked for
    v_full text[];  -- the agents whose room this call has taken
BEGIN
    IF p_per_owner > 0 THEN
        -- Held to the end of the claim's transaction; the statements below, each with a
        -- snapshot of its own, see what the claims before this one committed.
        PERFORM pg_advisory_xact_lock(hashtext('agenttasks_claim_runs'));
    END IF;
    v_ids := ARRAY(
        SELECT r.id FROM agenttasks_run r
         WHERE r.id = ANY(coalesce(p_first, '{}'))
           AND (r.not_before IS NULL OR r.not_before <= p_now)
         ORDER BY array_position(p_first, r.id));
    LOOP
        -- Runs without a task (a conversation's own, a chat's wake-ups among them) first, one by
        -- one; then the tasks' runs, in the order given.
        FOR v_id IN
            SELECT r.id FROM agenttasks_run r
             WHERE r.id = ANY(v_ids) AND r.status = 'queued'
               AND NOT EXISTS (SELECT 1 FROM agenttasks_task t WHERE t.run_id = r.id)
             ORDER BY array_position(v_ids, r.id)
        LOOP
            EXIT WHEN jsonb_array_length(v_claimed) >= p_limit;
            v_answer := agenttasks_claim_v2(v_id, p_worker, p_now, true, false);
            IF v_answer ? 'run' THEN
                v_claimed := v_claimed || jsonb_build_array(v_answer);
            ELSIF v_answer ? 'skipped' THEN
                v_passed := v_passed + 1;
            END IF;
        END LOOP;
        v_round := agenttasks_claim_tasks_v2(
            v_ids, p_worker, p_now, greatest(p_limit - jsonb_array_length(v_claimed), 0),
            v_delegates);
        v_claimed := v_claimed || (v_round->'claims');
        v_passed := v_passed + (v_round->>'passed')::integer;
        EXIT WHEN jsonb_array_length(v_claimed) >= p_limit;
        -- The last look found fewer than it asked for: it saw every due run.
        EXIT WHEN NOT v_delegates AND cardinality(v_ids) < v_wanted;
        -- Then the queued runs that are due, in fair order, a few more than needed since some
        -- are passed over; each statement here sees the runs committed since the last one.
        v_delegates := false;
        v_wanted := p_limit - jsonb_array_length(v_claimed) + 8;
        v_full := ARRAY(
            SELECT room.key FROM jsonb_each_text(coalesce(p_agent_room, '{}')) AS room
             WHERE room.value::integer <= (
                   SELECT count(*) FROM jsonb_array_elements(v_claimed) AS claim
                    WHERE claim->'run'->>'agent' = room.key));
        v_ids := ARRAY(
            WITH RECURSIVE owners(owner_id) AS (
                -- The owners with queued runs, one index probe each (a loose index scan).
                (SELECT r.owner_id FROM agenttasks_run r
                  WHERE r.status = 'queued' AND r.owner_id IS NOT NULL
                  ORDER BY r.owner_id LIMIT 1)
                UNION ALL
                SELECT (SELECT r.owner_id FROM agenttasks_run r
                         WHERE r.status = 'queued' AND r.owner_id > o.owner_id
                         ORDER BY r.owner_id LIMIT 1)
                  FROM owners o WHERE o.owner_id IS NOT NULL),
            running AS (
                SELECT r.owner_id, count(*) AS n
                  FROM agenttasks_run r
                 WHERE p_per_owner > 0 AND r.status = 'running' AND r.task_id IS NOT NULL
                 GROUP BY r.owner_id),
            candidates AS (
                -- Each owner's first runs in turn order; an owner at p_per_owner gives only
                -- runs without a task.
                SELECT d.* FROM owners o
                  LEFT JOIN running ON running.owner_id = o.owner_id
                 CROSS JOIN LATERAL (
                    SELECT r.id, r.trigger, r.queued_at, r.agent, r.priority, r.owner_id,
                           r.task_id IS NOT NULL AS of_task
                      FROM agenttasks_run r
                     WHERE r.status = 'queued' AND r.owner_id = o.owner_id
                       AND r.trigger <> 'wakeup' AND r.id <> ALL(v_seen)
                       AND (r.not_before IS NULL OR r.not_before <= p_now)
                       -- Not `r.agent <> ALL(v_full)`: a generic plan takes that for a filter
                       -- that leaves nothing when the queue holds one agent, and reads the table.
                       AND CASE WHEN cardinality(v_full) = 0 THEN true
                                ELSE r.agent <> ALL(v_full) END
                       AND (p_per_owner <= 0 OR r.task_id IS NULL
                            OR coalesce(running.n, 0) < p_per_owner)
                     ORDER BY r.priority DESC, r.queued_at, r.id
                     LIMIT v_wanted) d
                 WHERE o.owner_id IS NOT NULL
                UNION ALL
                (SELECT r.id, r.trigger, r.queued_at, r.agent, r.priority, r.owner_id,
                        r.task_id IS NOT NULL
                   FROM agenttasks_run r
                  WHERE r.status = 'queued' AND r.owner_id IS NULL
                    AND r.trigger <> 'wakeup' AND r.id <> ALL(v_seen)
                    AND (r.not_before IS NULL OR r.not_before <= p_now)
                    AND CASE WHEN cardinality(v_full) = 0 THEN true
                             ELSE r.agent <> ALL(v_full) END
                  ORDER BY r.priority DESC, r.queued_at, r.id
                  LIMIT v_wanted)
                UNION ALL
                (SELECT r.id, r.trigger, r.queued_at, r.agent, r.priority, r.owner_id,
                        r.task_id IS NOT NULL
                   FROM agenttasks_run r
                  WHERE r.status = 'queued' AND r.trigger = 'wakeup' AND r.id <> ALL(v_seen)
                    AND (r.not_before IS NULL OR r.not_before <= p_now)
                    AND CASE WHEN cardinality(v_full) = 0 THEN true
                             ELSE r.agent <> ALL(v_full) END
                  ORDER BY r.queued_at, r.id
                  LIMIT v_wanted)),
            due AS (
                SELECT c.*,
                       row_number() OVER share_order AS share,
                       count(*) FILTER (WHERE c.of_task) OVER share_order AS task_share
                  FROM candidates c
                WINDOW share_order AS (
                    PARTITION BY c.trigger = 'wakeup', c.owner_id
                    ORDER BY c.priority DESC, c.queued_at, c.id)),
            taken AS (
                SELECT claim->'run'->>'agent' AS agent, count(*) AS n
                  FROM jsonb_array_elements(v_claimed) AS claim
                 GROUP BY 1),
            allowed AS (
                SELECT due.*, row_number() OVER (
                           PARTITION BY due.agent
                           ORDER BY (due.trigger = 'wakeup') DESC, due.share,
                                    due.priority DESC, due.queued_at, due.id) AS agent_rank
                  FROM due LEFT JOIN running ON running.owner_id = due.owner_id
                 WHERE p_per_owner <= 0 OR NOT due.of_task OR due.owner_id IS NULL
                    OR due.task_share <= p_per_owner - coalesce(running.n, 0))
            SELECT allowed.id FROM allowed LEFT JOIN taken ON taken.agent = allowed.agent
             WHERE NOT coalesce(p_agent_room, '{}') ? allowed.agent
                OR allowed.agent_rank
                   <= (p_agent_room->>allowed.agent)::integer - coalesce(taken.n, 0)
             ORDER BY (trigger = 'wakeup') DESC, share, priority DESC, queued_at, allowed.id
             LIMIT v_wanted);
        EXIT WHEN cardinality(v_ids) = 0;
        v_seen := v_seen || v_ids;
    END LOOP;
    RETURN jsonb_build_object(
        'claims', v_claimed, 'passed', v_passed,
        'next_at', (SELECT min(not_before) FROM agenttasks_run
                     WHERE status = 'queued' AND not_before > p_now));
END
$$;
