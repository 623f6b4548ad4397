-- Requests per minute shared by every instance (gateway/postgres_limiter.py): one row per
-- bucket (a key or a project id) holding its GCRA theoretical arrival time, in microseconds
-- since the epoch on the database's clock, so the instances' own clocks never matter.
-- UNLOGGED: a request writes no WAL and waits for no flush. A crash of the database
-- server empties the table, which forgives at most one minute of requests; a row
-- whose time is past is the same as no row, which is what the pruner removes.
CREATE UNLOGGED TABLE rate_limits (
    bucket TEXT PRIMARY KEY,
    tat BIGINT NOT NULL
);

-- Take one request from every bucket (distinct names), or from none. Returns 0, or the
-- whole seconds until the request would be allowed (at least 1). A bucket of `rpm` may
-- spend its whole minute at once, then gets one request back every T = ceil(60e6 / rpm)
-- µs: allowed while max(tat, now) + T - now stays within rpm * T (a minute, rounded up to
-- whole µs per request: never more than rpm in any minute).
-- Rows are locked one by one in name order, a missing one inserted in its turn (so two
-- requests sharing a project never deadlock), and the clock is read once all are held.
-- Statements by primary key per bucket: measured cheaper than set-based ones over unnest.
-- `at_us` replaces the clock (conformance tests).
CREATE FUNCTION rate_limit_take(names TEXT[], rpms INTEGER[], at_us BIGINT DEFAULT NULL)
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    tats BIGINT[];
    held BIGINT;
    now_us BIGINT;
    debt BIGINT := 0;
    t BIGINT;
    i INTEGER;
BEGIN
    FOR i IN SELECT o FROM unnest(names) WITH ORDINALITY AS u (n, o) ORDER BY n LOOP
        LOOP
            SELECT r.tat INTO held FROM rate_limits AS r WHERE r.bucket = names[i] FOR UPDATE;
            EXIT WHEN FOUND;
            -- A new bucket starts full; concurrent first requests insert it once.
            INSERT INTO rate_limits (bucket, tat) VALUES (names[i], 0) ON CONFLICT DO NOTHING;
        END LOOP;
        tats[i] := held;
    END LOOP;
    now_us := coalesce(at_us, (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT);
    FOR i IN 1 .. cardinality(names) LOOP
        t := (60000000 + rpms[i] - 1) / rpms[i];
        debt := greatest(debt, greatest(tats[i], now_us) + t - now_us - t * rpms[i]);
    END LOOP;
    IF debt > 0 THEN
        RETURN (debt + 999999) / 1000000;
    END IF;
    FOR i IN 1 .. cardinality(names) LOOP
        UPDATE rate_limits SET tat = greatest(tats[i], now_us) + (60000000 + rpms[i] - 1) / rpms[i]
            WHERE bucket = names[i];
    END LOOP;
    RETURN 0;
END
$$;
