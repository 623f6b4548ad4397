-- The instances serving from this database, each leased (decisions.md, "Several
-- instances"), and the admin change counter they acknowledge.
--
-- Every change of a key or project (the columns of the notify triggers of 0001 and 0007)
-- takes the next admin change number in the same transaction and notifies it as the
-- payload. The counter's one row serializes admin changes, so numbers are committed, and
-- notifications delivered, in order. An instance renewing its lease reads the counter
-- FOR SHARE after renewing, so a change either commits before that read (the instance
-- learns its number and drops its caches before it serves again) or after the renewal
-- (the waiter then finds the instance live and waits for its acknowledgement).

CREATE FUNCTION gateway_now_ms() RETURNS BIGINT LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
$$;

CREATE TABLE admin_changes (
    one INTEGER PRIMARY KEY DEFAULT 1 CHECK (one = 1),
    n   BIGINT NOT NULL
);
INSERT INTO admin_changes (n) VALUES (0);

CREATE TABLE instances (
    id          TEXT PRIMARY KEY,   -- host:pid:start-time, the owner of its holds and runs
    started_at  BIGINT NOT NULL,    -- milliseconds, the database's clock
    lease_until BIGINT NOT NULL,    -- milliseconds, the database's clock
    acked       BIGINT NOT NULL DEFAULT 0 -- the newest admin change its caches reflect
);

CREATE OR REPLACE FUNCTION gateway_admin_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    change BIGINT;
BEGIN
    UPDATE admin_changes SET n = n + 1 RETURNING n INTO change;
    PERFORM pg_notify('gateway_admin', change::TEXT);
    RETURN NULL;
END
$$;
