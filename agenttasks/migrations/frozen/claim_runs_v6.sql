-- Claims, version 6 of the claim of several runs (docs/architecture.md#in-flight-runs): a run
-- whose not_before has not come is left queued, and the queued runs are taken fairly: wake-up
-- runs of parents first (they finish what has begun), then owner by owner (each owner's best
-- run, then each owner's second, ...), a higher task priority first within an owner's share and
-- between owners' runs of the same rank, then the oldest. p_per_owner (0: none): an owner with
-- that many runs of tasks running gets no more of them until one ends (the runs named in
-- p_first, which their callers wait on, and runs without a task are not held back); and
-- p_agent_room ({agent: n}): no more than n runs of that agent are taken in fair order (its model
-- endpoint's line of turns has room for n more), the runs of the agent claimed by this call
-- counted. Answers {"claims": [...], "passed": n, "next_at": t}: next_at is the earliest
-- not_before still to come (null when none), so the claimer knows when to look again.
-- Version 5 looks for due runs again only when the last look found as many as it asked for:
-- version 4 looked until a look found nothing new, so in a burst one claim went on taking the
-- runs committed while it ran, each look reading the queue again (the runs committed since are
-- the next claim's: each one's notification asks for it).
-- Version 6 makes p_per_owner hard: its claims take turns (a transaction-level advisory lock),
-- so each one's looks see the runs the claim before it took. In version 5 a claim that passed
-- over the runs another claim held went on to those owners' next runs, and an owner could end
-- with several runs beyond the limit.
CREATE FUNCTION agenttasks_claim_runs_v6(
    p_worker text, p_limit integer, p_now timestamptz, p_first text[], p_per_owner integer,
    p_agent_room jsonb
) RETURNS jsonb
LANGUAGE plpgsql AS $$
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
        v_ids := ARRAY(
            WITH running AS (
                SELECT c.owner_id, count(*) AS n
                  FROM agenttasks_run r
                  JOIN agenttasks_conversation c ON c.id = r.conversation_id
                 WHERE p_per_owner > 0 AND r.status = 'running' AND r.task_id IS NOT NULL
                 GROUP BY c.owner_id),
            taken AS (
                SELECT claim->'run'->>'agent' AS agent, count(*) AS n
                  FROM jsonb_array_elements(v_claimed) AS claim
                 GROUP BY 1),
            due AS (
                SELECT r.id, r.trigger, r.queued_at, r.agent, coalesce(t.priority, 0) AS priority,
                       t.id IS NOT NULL AS of_task, c.owner_id,
                       row_number() OVER share_order AS share,
                       count(t.id) OVER share_order AS task_share
                  FROM agenttasks_run r
                  JOIN agenttasks_conversation c ON c.id = r.conversation_id
                  LEFT JOIN agenttasks_task t ON t.run_id = r.id
                 WHERE r.status = 'queued' AND r.id <> ALL(v_seen)
                   AND (r.not_before IS NULL OR r.not_before <= p_now)
                WINDOW share_order AS (
                    PARTITION BY c.owner_id
                    ORDER BY coalesce(t.priority, 0) DESC, r.queued_at, r.id)),
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
