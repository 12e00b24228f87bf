-- A request's turn in its model endpoint's budget, version 1: flow.budgets.reserve as one
-- statement (docs/operating.md#meeting-your-providers-limits). The endpoint's row is made on its
-- first use and locked; the start is the latest of now, its next free start, its pause and (with
-- a token limit) the moment its tokens are free; the next free start moves on by one request's
-- share of the rate (the configured one at p->>'headroom' of it, or the learned one, the lower).
-- With p->>'horizon', a start further off is not reserved: the answer is "later", with the
-- request's place in the line p->>'line' of the parked runs (or the next free start for a run
-- parked before). Under p->>'concurrent', a request takes a permit, or answers "busy".
-- The constants (headroom, growth, quiet, permit_slack) come in p, from flow/budgets.py.
-- Answers {"start", "rate", "busy", "later", "permit", "free_start"}: free_start is the next
-- free start the request found (its start, unless it parked in a line).
CREATE FUNCTION agenttasks_reserve_v1(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_endpoint text := p->>'endpoint';
    v_rpm float8 := (p->>'requests_per_minute')::float8;
    v_tpm float8 := (p->>'tokens_per_minute')::float8;
    v_concurrent integer := (p->>'concurrent')::integer;
    v_headroom float8 := (p->>'headroom')::float8;
    v_configured float8;
    v_now timestamptz;
    v_start timestamptz;
    v_token_start timestamptz;
    v_rate float8;
    v_place timestamptz;
    v_elapsed float8;
    v_permit bigint;
    b agenttasks_providerbudget;
BEGIN
    INSERT INTO agenttasks_providerbudget (endpoint, recent_rate, refusals, parked_lines)
    VALUES (v_endpoint, 0, 0, '{}') ON CONFLICT (endpoint) DO NOTHING;
    SELECT * INTO b FROM agenttasks_providerbudget WHERE endpoint = v_endpoint FOR UPDATE;
    v_now := clock_timestamp();  -- after the lock, as the ORM path reads it
    IF v_concurrent IS NOT NULL AND (
        SELECT count(*) FROM agenttasks_providerpermit
         WHERE endpoint = v_endpoint AND expires_at > v_now) >= v_concurrent THEN
        RETURN jsonb_build_object('start', v_now, 'busy', true);
    END IF;
    v_start := greatest(v_now, coalesce(b.next_start, v_now), coalesce(b.paused_until, v_now));
    v_token_start := greatest(v_now, coalesce(b.next_tokens, v_now));
    IF v_tpm IS NOT NULL THEN
        v_start := greatest(v_start, v_token_start);
    END IF;
    v_configured := v_headroom * v_rpm / 60;
    v_rate := CASE WHEN v_configured IS NULL THEN b.learned_rate
                   WHEN b.learned_rate IS NULL THEN v_configured
                   ELSE least(v_configured, b.learned_rate) END;
    IF (p->>'horizon') IS NOT NULL
       AND extract(epoch FROM v_start - v_now) > (p->>'horizon')::float8 THEN
        IF (p->>'parked_before')::boolean THEN
            RETURN jsonb_build_object(
                'start', v_start, 'rate', v_rate, 'later', true, 'free_start', v_start);
        END IF;
        v_place := greatest(v_start, coalesce((b.parked_lines->>(p->>'line'))::timestamptz,
                                              v_start));
        UPDATE agenttasks_providerbudget
           SET parked_lines = coalesce((
                   SELECT jsonb_object_agg(key, value) FROM jsonb_each_text(
                       b.parked_lines || jsonb_build_object(
                           p->>'line',
                           v_place + make_interval(secs => coalesce(1 / v_rate, 0))))
                    WHERE value::timestamptz > v_now), '{}')
         WHERE endpoint = v_endpoint;
        RETURN jsonb_build_object(
            'start', v_place, 'rate', v_rate, 'later', true, 'free_start', v_start);
    END IF;
    -- The start counts in the recent rate; a learned rate grows back once refusals stop.
    v_elapsed := coalesce(extract(epoch FROM v_now - b.recent_at), 0);
    b.recent_rate := CASE WHEN b.recent_at IS NULL THEN 1
                          ELSE b.recent_rate * exp(-v_elapsed) + 1 END;
    b.recent_at := v_now;
    IF b.learned_rate IS NOT NULL AND (
        b.limited_at IS NULL
        OR extract(epoch FROM v_now - b.limited_at) > (p->>'quiet')::float8) THEN
        b.learned_rate := b.learned_rate * (1 + (p->>'growth')::float8 * least(v_elapsed, 1));
        IF v_configured IS NOT NULL AND b.learned_rate >= v_configured THEN
            b.learned_rate := NULL;  -- the configured rate bounds it again
        END IF;
    END IF;
    UPDATE agenttasks_providerbudget
       SET next_start = CASE WHEN v_rate IS NOT NULL
                             THEN v_start + make_interval(secs => 1 / v_rate)
                             ELSE next_start END,
           next_tokens = CASE WHEN v_tpm IS NOT NULL
                              THEN v_token_start + make_interval(
                                  secs => 60 * (p->>'tokens')::float8 / (v_headroom * v_tpm))
                              ELSE next_tokens END,
           recent_rate = b.recent_rate, recent_at = b.recent_at, learned_rate = b.learned_rate
     WHERE endpoint = v_endpoint;
    IF v_concurrent IS NOT NULL THEN
        INSERT INTO agenttasks_providerpermit (endpoint, expires_at)
        VALUES (v_endpoint, v_start + make_interval(
                    secs => (p->>'timeout')::float8 + (p->>'permit_slack')::float8))
        RETURNING id INTO v_permit;
    END IF;
    RETURN jsonb_build_object(
        'start', v_start, 'rate', v_rate, 'permit', v_permit, 'free_start', v_start);
END
$$;
