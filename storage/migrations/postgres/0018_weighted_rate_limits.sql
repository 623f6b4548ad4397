-- Rate limits become weighted: tokens per minute beside requests per minute, one rule
-- (pipeline/gcra.py), which PostgreSQL runs as the in-process and Redis limiters do: GCRA
-- as a continuous-state leaky bucket, in whole numbers. One row per bucket (`rpm:<id>`,
-- `tpm:<id>`): the units it still owes times 60000 (`level`) as of `at_ms` (the
-- database's clock, whole milliseconds), draining its units per minute each millisecond,
-- and when it is full again (`empty_at_ms`: the pruner deletes it after that, when it is
-- the same as no row). UNLOGGED, as 0008's table was: a request writes no WAL and waits
-- for no flush; a crash of the database server empties the table, which forgives what
-- the buckets owed. 0008's buckets go with this migration: at most a minute forgiven once.
DROP FUNCTION rate_limit_take(TEXT[], INTEGER[], BIGINT);
DROP TABLE rate_limits;

CREATE UNLOGGED TABLE rate_buckets (
    bucket      TEXT PRIMARY KEY,
    at_ms       BIGINT NOT NULL,
    level       BIGINT NOT NULL,
    empty_at_ms BIGINT NOT NULL
);

-- Move units into every bucket (distinct names) of a request. A take (`forced` false)
-- goes into all of them or none: refused while one would owe more than a minute
-- (level + units * 60000 > per_minute * 60000; units are at most per_minute). A
-- settlement (`forced` true) goes into all, whatever they owe; negative units give back,
-- never beyond a full bucket (level 0). `wait`: 0, or the whole seconds until the take
-- would pass (at least 1); `refused`: the 0-based index of the bucket that waits longest
-- (the first of equals), -1 when none.
-- Rows are locked one by one in name order, a missing one inserted in its turn (so two
-- requests sharing a project never deadlock), and the clock is read once all are held.
-- Statements by primary key per bucket: measured cheaper than set-based ones over unnest
-- (0008). `at_us` replaces the clock (conformance tests).
CREATE FUNCTION rate_limit_move(
    names TEXT[], per_minute BIGINT[], units BIGINT[], forced BOOLEAN,
    at_us BIGINT DEFAULT NULL, OUT wait INTEGER, OUT refused INTEGER
) LANGUAGE plpgsql AS $$
DECLARE
    ats BIGINT[];
    levels BIGINT[];
    held_at BIGINT;
    held_level BIGINT;
    now_ms BIGINT;
    over BIGINT;
    longest BIGINT := 0;
    i INTEGER;
BEGIN
    wait := 0;
    refused := -1;
    FOR i IN SELECT o FROM unnest(names) WITH ORDINALITY AS u (n, o) ORDER BY n LOOP
        LOOP
            SELECT r.at_ms, r.level INTO held_at, held_level
                FROM rate_buckets AS r WHERE r.bucket = names[i] FOR UPDATE;
            EXIT WHEN FOUND;
            -- A new bucket starts full; concurrent first requests insert it once.
            INSERT INTO rate_buckets VALUES (names[i], 0, 0, 0) ON CONFLICT DO NOTHING;
        END LOOP;
        ats[i] := held_at;
        levels[i] := held_level;
    END LOOP;
    now_ms := coalesce(at_us / 1000, floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT);
    FOR i IN 1 .. cardinality(names) LOOP
        IF now_ms > ats[i] THEN
            -- Drained since: at most down to full (the elapsed time capped so that the
            -- product stays within the level).
            levels[i] := greatest(0, levels[i] - least(
                now_ms - ats[i], (levels[i] + per_minute[i] - 1) / per_minute[i]
            ) * per_minute[i]);
            ats[i] := now_ms;
        END IF;
        over := levels[i] + (units[i] - per_minute[i]) * 60000;
        IF NOT forced AND over > 0 AND (over + per_minute[i] - 1) / per_minute[i] > longest THEN
            longest := (over + per_minute[i] - 1) / per_minute[i];
            refused := i - 1;
        END IF;
    END LOOP;
    IF longest > 0 THEN
        wait := (longest + 999) / 1000;
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(names) LOOP
        levels[i] := greatest(0, levels[i] + units[i] * 60000);
        UPDATE rate_buckets
            SET at_ms = ats[i], level = levels[i],
                empty_at_ms = ats[i] + (levels[i] + per_minute[i] - 1) / per_minute[i]
            WHERE bucket = names[i];
    END LOOP;
END
$$;
