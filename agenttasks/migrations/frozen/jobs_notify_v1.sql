-- Jobs, version 1: each statement that enqueues django-q2 jobs (into django_q_ormq, whatever writes
-- them: django-q2's broker, or agenttasks' own functions) notifies 'agenttasks_jobs' at its commit,
-- so the idle pushers of agenttasks.broker.orm.ListeningORM take the jobs at once instead of
-- polling the queue. Notifications of one transaction with one payload are delivered once.
CREATE FUNCTION agenttasks_jobs_enqueued_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agenttasks_jobs', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER agenttasks_jobs_enqueued
    AFTER INSERT ON django_q_ormq
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_jobs_enqueued_v1();
