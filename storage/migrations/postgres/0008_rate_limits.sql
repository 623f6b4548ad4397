-- Requests per minute shared by every instance (gateway/limiter.py): one row per bucket
-- (a key or a project id) holding its GCRA theoretical arrival time, in microseconds since
-- the epoch on the database's clock, so the instances' own clocks never matter.
-- UNLOGGED: a request writes no WAL and waits for no flush. A crash of the database
-- server empties the table, which forgives at most one minute of requests; a row
-- whose time is past is the same as no row, which is what the pruner removes.
CREATE UNLOGGED TABLE rate_limits (
    bucket TEXT PRIMARY KEY,
    tat BIGINT NOT NULL
);

-- Take one request from every bucket (distinct names), or from none. Returns 0, or the
-- whole seconds until the request would be allowed (at least 1). A bucket of `rpm` may
-- spend its whole minute at once, then gets one request back every ceil(60e6 / rpm) µs:
-- allowed while its debt, max(tat, now) + T - now, stays within rpm * T (one minute,
-- rounded up to whole µs per request: never more than rpm in any minute).
-- Rows are locked in name order, so two requests sharing a project never deadlock, and
-- the clock is read once they are held. `at_us` replaces the clock (conformance tests).
CREATE FUNCTION rate_limit_take(names TEXT[], rpms INTEGER[], at_us BIGINT DEFAULT NULL)
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    now_us BIGINT;
    locked BIGINT;
    debt BIGINT;
BEGIN
    LOOP
        INSERT INTO rate_limits (bucket, tat)
            SELECT n, 0 FROM unnest(names) AS n ORDER BY n
            ON CONFLICT (bucket) DO NOTHING;
        PERFORM 1 FROM rate_limits WHERE bucket = ANY (names) ORDER BY bucket FOR UPDATE;
        GET DIAGNOSTICS locked = ROW_COUNT;
        EXIT WHEN locked = cardinality(names);  -- else pruned in between: insert it again
    END LOOP;
    now_us := coalesce(at_us, (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT);
    SELECT max(greatest(r.tat, now_us) + w.t - now_us - w.t * w.rpm) INTO debt
        FROM rate_limits AS r
        JOIN (SELECT n, rpm, (60000000 + rpm - 1) / rpm AS t
              FROM unnest(names, rpms) AS u (n, rpm)) AS w ON w.n = r.bucket;
    IF debt > 0 THEN
        RETURN (debt + 999999) / 1000000;
    END IF;
    UPDATE rate_limits AS r SET tat = greatest(r.tat, now_us) + w.t
        FROM (SELECT n, (60000000 + rpm - 1) / rpm AS t
              FROM unnest(names, rpms) AS u (n, rpm)) AS w
        WHERE w.n = r.bucket;
    RETURN 0;
END
$$;
