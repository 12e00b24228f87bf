-- Claims, version 2: one queued run, or several at once (docs/architecture.md#in-flight-runs).
-- Version 2 is version 1 on the helpers of helpers_v1.sql, which name a run's trigger
-- (agenttasks_trigger_name_v1) as states.trigger_name does.
--
-- agenttasks_claim_v2 moves one queued run (and its task) to running for a worker. Lock order:
-- task, conversation, run, parent conversation; a run without a task: its conversation, then
-- the run. With p_skip_locked (a claim of several runs) it never waits for a row that another
-- claim of several could hold while waiting in turn: the task (or a taskless run's
-- conversation) and the parent conversation are taken with SKIP LOCKED, the parent right after
-- the task, and a run whose row is held is passed over. Without p_delegates a delegate child's
-- run is passed over too: the caller that spawned it executes it inline. It answers the task,
-- run and conversation as written; null when the run is not the one to run; {"missing": true}
-- for an unknown run; {"skipped": true} for a run passed over.
CREATE FUNCTION agenttasks_claim_v2(
    p_run_id text, p_worker text, p_now timestamptz, p_skip_locked boolean, p_delegates boolean
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    t agenttasks_task;
    c agenttasks_conversation;
    r agenttasks_run;
    v_events jsonb := '[]';
BEGIN
    IF p_skip_locked THEN
        SELECT * INTO t FROM agenttasks_task WHERE run_id = p_run_id
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM agenttasks_task WHERE run_id = p_run_id) THEN
            RETURN jsonb_build_object('skipped', true);
        END IF;
    ELSE
        SELECT * INTO t FROM agenttasks_task WHERE run_id = p_run_id FOR NO KEY UPDATE;
    END IF;
    IF t.id IS NOT NULL THEN
        IF t.kind = 'delegate' AND NOT p_delegates THEN
            RETURN jsonb_build_object('skipped', true);
        END IF;
        IF t.status <> 'pending' THEN
            RETURN NULL;
        END IF;
        IF p_skip_locked AND t.parent_conversation_id IS NOT NULL THEN
            PERFORM 1 FROM agenttasks_conversation WHERE id = t.parent_conversation_id
               FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                RETURN jsonb_build_object('skipped', true);
            END IF;
        END IF;
        SELECT * INTO c FROM agenttasks_conversation WHERE id = t.conversation_id
           FOR NO KEY UPDATE;
        SELECT * INTO r FROM agenttasks_run WHERE id = p_run_id FOR NO KEY UPDATE;
        -- The transition table's pending -> running, bound to the run the task names.
        IF r.status <> 'queued' OR c.deleting_at IS NOT NULL THEN
            RETURN NULL;
        END IF;
        IF NOT p_skip_locked AND t.parent_conversation_id IS NOT NULL THEN
            PERFORM 1 FROM agenttasks_conversation WHERE id = t.parent_conversation_id
               FOR NO KEY UPDATE;
        END IF;
        IF r.started_at IS NULL THEN
            v_events := jsonb_build_array(agenttasks_event_v1(c.id, 'run.started',
                jsonb_build_object(
                    'trigger', agenttasks_trigger_name_v1(r.trigger),
                    'attempt', r.attempt),
                r.id, t.id));
        END IF;
        UPDATE agenttasks_run
           SET status = 'running', worker = p_worker, heartbeat_at = p_now,
               started_at = coalesce(started_at, p_now)
         WHERE id = p_run_id RETURNING * INTO r;
        UPDATE agenttasks_task
           SET status = 'running', started_at = coalesce(started_at, p_now),
               updated_at = p_now, version = version + 1
         WHERE id = t.id RETURNING * INTO t;
        PERFORM agenttasks_append_v1(v_events || agenttasks_status_events_v1(t, 'pending', ''), p_now);
        RETURN jsonb_build_object(
            'task', to_jsonb(t), 'run', to_jsonb(r), 'conversation', to_jsonb(c));
    END IF;
    -- A run without a task (or one its task has left).
    IF p_skip_locked THEN
        SELECT * INTO c FROM agenttasks_conversation
         WHERE id = (SELECT conversation_id FROM agenttasks_run WHERE id = p_run_id)
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM agenttasks_run WHERE id = p_run_id) THEN
            RETURN jsonb_build_object('skipped', true);
        END IF;
    ELSE
        SELECT * INTO c FROM agenttasks_conversation
         WHERE id = (SELECT conversation_id FROM agenttasks_run WHERE id = p_run_id)
           FOR NO KEY UPDATE;
    END IF;
    SELECT * INTO r FROM agenttasks_run WHERE id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('missing', true);
    END IF;
    IF r.status <> 'queued' THEN
        RETURN NULL;
    END IF;
    IF r.task_id IS NOT NULL OR c.deleting_at IS NOT NULL THEN
        -- Housekeeping: a queued run its task left (or on a dying conversation) never runs.
        UPDATE agenttasks_run SET status = 'cancelled', ended_at = p_now, error = ''
         WHERE id = p_run_id;
        RETURN NULL;
    END IF;
    IF r.started_at IS NULL THEN
        v_events := jsonb_build_array(agenttasks_event_v1(c.id, 'run.started',
            jsonb_build_object('trigger', r.trigger), r.id, ''));
    END IF;
    UPDATE agenttasks_run
       SET status = 'running', worker = p_worker, heartbeat_at = p_now,
           started_at = coalesce(started_at, p_now)
     WHERE id = p_run_id RETURNING * INTO r;
    PERFORM agenttasks_append_v1(v_events, p_now);
    RETURN jsonb_build_object('run', to_jsonb(r), 'conversation', to_jsonb(c));
END
$$;

-- Claim, in one go, the queued runs of p_run_ids whose tasks are pending (delegate children only
-- with p_delegates), at most p_limit, in the order given: each is agenttasks_claim_v2 with
-- SKIP LOCKED, written for all of them at once (each UPDATE, and so each statement trigger,
-- runs once). Lock order as agenttasks_claim_v2's: the tasks and the parent conversations
-- SKIP LOCKED, then the tasks' conversations and runs, each in id order. Answers
-- {"claims": [...], "passed": n}: n of the tasks it could have claimed were held elsewhere.
CREATE FUNCTION agenttasks_claim_tasks_v2(
    p_run_ids text[], p_worker text, p_now timestamptz, p_limit integer, p_delegates boolean
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_tasks text[];
    v_parents text[];
    v_fresh text[];
    v_events jsonb;
    v_claimed jsonb;
    v_wanted integer;
BEGIN
    SELECT count(*) INTO v_wanted FROM agenttasks_task t
     WHERE t.run_id = ANY(p_run_ids) AND t.status = 'pending'
       AND (p_delegates OR t.kind <> 'delegate');
    v_wanted := least(v_wanted, p_limit);
    SELECT array_agg(id) INTO v_tasks FROM (
        SELECT t.id FROM agenttasks_task t
         WHERE t.run_id = ANY(p_run_ids) AND t.status = 'pending'
           AND (p_delegates OR t.kind <> 'delegate')
         ORDER BY array_position(p_run_ids, t.run_id)
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED) AS locked;
    IF v_tasks IS NULL THEN
        RETURN jsonb_build_object('claims', '[]'::jsonb, 'passed', v_wanted);
    END IF;
    SELECT array_agg(id) INTO v_parents FROM (
        SELECT c.id FROM agenttasks_conversation c
         WHERE c.id IN (SELECT parent_conversation_id FROM agenttasks_task WHERE id = ANY(v_tasks))
         ORDER BY c.id
           FOR NO KEY UPDATE SKIP LOCKED) AS locked;
    PERFORM 1 FROM agenttasks_conversation
      WHERE id IN (SELECT conversation_id FROM agenttasks_task WHERE id = ANY(v_tasks))
      ORDER BY id FOR NO KEY UPDATE;
    PERFORM 1 FROM agenttasks_run
      WHERE id IN (SELECT run_id FROM agenttasks_task WHERE id = ANY(v_tasks))
      ORDER BY id FOR NO KEY UPDATE;
    -- The transition table's pending -> running, bound to the run the task names, on a live
    -- conversation (and a parent conversation this claim holds).
    v_tasks := ARRAY(
        SELECT t.id FROM agenttasks_task t
          JOIN agenttasks_run r ON r.id = t.run_id
          JOIN agenttasks_conversation c ON c.id = t.conversation_id
         WHERE t.id = ANY(v_tasks) AND t.status = 'pending' AND r.status = 'queued'
           AND c.deleting_at IS NULL
           AND (t.parent_conversation_id IS NULL
                OR t.parent_conversation_id = ANY(coalesce(v_parents, '{}'))));
    IF cardinality(v_tasks) = 0 THEN
        RETURN jsonb_build_object('claims', '[]'::jsonb, 'passed', v_wanted);
    END IF;
    v_fresh := ARRAY(
        SELECT r.id FROM agenttasks_run r JOIN agenttasks_task t ON t.run_id = r.id
         WHERE t.id = ANY(v_tasks) AND r.started_at IS NULL);
    UPDATE agenttasks_run r
       SET status = 'running', worker = p_worker, heartbeat_at = p_now,
           started_at = coalesce(r.started_at, p_now)
      FROM agenttasks_task t
     WHERE t.id = ANY(v_tasks) AND r.id = t.run_id;
    UPDATE agenttasks_task
       SET status = 'running', started_at = coalesce(started_at, p_now),
           updated_at = p_now, version = version + 1
     WHERE id = ANY(v_tasks);
    -- Task by task, in claim order: run.started (a first start), then the task.status events.
    SELECT coalesce(jsonb_agg(e ORDER BY o, k), '[]') INTO v_events FROM (
        SELECT array_position(p_run_ids, t.run_id) AS o, 0 AS k,
               agenttasks_event_v1(t.conversation_id, 'run.started', jsonb_build_object(
                   'trigger', agenttasks_trigger_name_v1(r.trigger),
                   'attempt', r.attempt), r.id, t.id) AS e
          FROM agenttasks_task t JOIN agenttasks_run r ON r.id = t.run_id
         WHERE t.id = ANY(v_tasks) AND r.id = ANY(v_fresh)
        UNION ALL
        SELECT array_position(p_run_ids, t.run_id), s.n, s.e
          FROM agenttasks_task t,
               jsonb_array_elements(agenttasks_status_events_v1(t, 'pending', ''))
                   WITH ORDINALITY AS s(e, n)
         WHERE t.id = ANY(v_tasks)
    ) AS events;
    PERFORM agenttasks_append_v1(v_events, p_now);
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'task', to_jsonb(t), 'run', to_jsonb(r), 'conversation', to_jsonb(c))
               ORDER BY array_position(p_run_ids, t.run_id)), '[]')
      INTO v_claimed
      FROM agenttasks_task t
      JOIN agenttasks_run r ON r.id = t.run_id
      JOIN agenttasks_conversation c ON c.id = t.conversation_id
     WHERE t.id = ANY(v_tasks);
    RETURN jsonb_build_object(
        'claims', v_claimed, 'passed', greatest(v_wanted - cardinality(v_tasks), 0));
END
$$;

-- Claim up to p_limit queued runs for a worker in one statement: the runs named in p_first
-- (the runs of the jobs that woke the worker, delegate children included) first, then the
-- oldest queued runs. The claims take SKIP LOCKED, so concurrent claimers never wait for each
-- other and never claim one run twice. Answers {"claims": [...], "passed": n}: the claims as
-- agenttasks_claim_v2 writes them, and how many claimable runs it passed over because another
-- transaction held them (the caller tries again soon).
CREATE FUNCTION agenttasks_claim_runs_v2(
    p_worker text, p_limit integer, p_now timestamptz, p_first text[]
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_claimed jsonb := '[]';
    v_round jsonb;
    v_passed integer := 0;
    v_seen text[] := coalesce(p_first, '{}');
    v_ids text[] := coalesce(p_first, '{}');
    v_delegates boolean := true;
    v_id text;
    v_answer jsonb;
BEGIN
    LOOP
        v_round := agenttasks_claim_tasks_v2(
            v_ids, p_worker, p_now, p_limit - jsonb_array_length(v_claimed), v_delegates);
        v_claimed := v_claimed || (v_round->'claims');
        v_passed := v_passed + (v_round->>'passed')::integer;
        -- Runs without a task (a conversation's own), one by one.
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
        EXIT WHEN jsonb_array_length(v_claimed) >= p_limit;
        -- Then the oldest (agenttasks_run_queue_idx), a few more than needed since some are
        -- passed over; each statement here sees the runs committed since the last one.
        v_delegates := false;
        v_ids := ARRAY(
            SELECT id FROM agenttasks_run
             WHERE status = 'queued' AND id <> ALL(v_seen)
             ORDER BY queued_at, id
             LIMIT p_limit - jsonb_array_length(v_claimed) + 8);
        EXIT WHEN cardinality(v_ids) = 0;
        v_seen := v_seen || v_ids;
    END LOOP;
    RETURN jsonb_build_object('claims', v_claimed, 'passed', v_passed);
END
$$;
