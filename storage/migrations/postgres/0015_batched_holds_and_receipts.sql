-- Holds and receipts in batches (storage/postgres.py): the concurrent requests of one
-- instance reserve (or settle) in one statement, so a hot project's row is locked once
-- per batch and one commit serves them all. Each item meets every rule it meets alone
-- (the triggers of 0002 and 0012). No subtransaction per item (they would make every
-- other session's lock checks slow): an item that raises (a refused hold) aborts the
-- batch, nothing of it committed, and the caller then runs each item alone. The caller
-- sorts the items by project and key, so every batch locks projects and keys in one order.

CREATE FUNCTION gateway_reserve_many(batch jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,
                              created_at)
    SELECT id, project_id, key_id, amount, month, owner, lease_until, created_at
    FROM jsonb_to_recordset(batch) AS x(
        id text, project_id text, key_id text, amount bigint, month text, owner text,
        lease_until bigint, created_at bigint);
END
$$;

-- One answer per item, in order: true (charged), or false (its hold was gone or did not
-- cover the cost: nothing written), as one settlement alone.
CREATE FUNCTION gateway_settle_many(batch jsonb) RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    r record;
    answers boolean[] := '{}';
BEGIN
    FOR r IN SELECT * FROM jsonb_to_recordset(batch) AS x(
        id text, reservation_id text, project_id text, key_id text, request_id text,
        kind text, endpoint text, model_or_runtime text, status text, usage jsonb,
        cost bigint, month text, created_at bigint, request_sha256 text,
        response_sha256 text, request_salt text, response_salt text,
        request_commitment text, response_commitment text, usage_source text,
        provider text)
    LOOP
        -- Inserted only while its hold is open and covers the cost; the subquery locks
        -- the hold.
        INSERT INTO receipts (id, reservation_id, project_id, key_id, request_id, kind,
            endpoint, model_or_runtime, status, usage, cost, month, created_at,
            request_sha256, response_sha256, request_salt, response_salt,
            request_commitment, response_commitment, usage_source, provider)
        SELECT r.id, r.reservation_id, r.project_id, r.key_id, r.request_id, r.kind,
            r.endpoint, r.model_or_runtime, r.status, r.usage, r.cost, r.month,
            r.created_at, r.request_sha256, r.response_sha256, r.request_salt,
            r.response_salt, r.request_commitment, r.response_commitment,
            r.usage_source, r.provider
        WHERE EXISTS (SELECT 1 FROM reservations
            WHERE id = r.reservation_id AND project_id = r.project_id
              AND amount >= r.cost FOR UPDATE);
        answers := answers || FOUND;
    END LOOP;
    RETURN answers;
END
$$;
