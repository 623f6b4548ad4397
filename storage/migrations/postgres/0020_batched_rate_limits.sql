-- Rate-limit moves in batches (storage/postgres/cluster.py): the concurrent requests of
-- one instance take from their buckets (or give back to them) in one statement, as their
-- holds and receipts do since 0015, so a hot project's bucket is locked and written once
-- per batch, and one round trip serves the batch instead of one per request.
-- Each item is decided exactly as `rate_limit_move` (0018) would decide it, run alone
-- right after the items before it: all of its buckets or none, on the database's clock
-- (or its own `at_us`). The batch's distinct buckets are locked once, in name order,
-- before the clock is read, so batches and single moves never deadlock each other.
-- Items come flattened: item k owns the next `sizes[k]` entries of names, per_minute and
-- units. Answers, per item: `waits[k]` (0: moved) and `refused[k]` (-1, or the 0-based
-- index of its bucket that waits longest), as rate_limit_move's.
CREATE FUNCTION rate_limit_move_many(
    sizes INTEGER[], names TEXT[], per_minute BIGINT[], units BIGINT[], forced BOOLEAN[],
    at_us BIGINT[], OUT waits INTEGER[], OUT refused INTEGER[]
) LANGUAGE plpgsql AS $$
DECLARE
    held TEXT[];       -- the batch's distinct buckets, in name order
    ats BIGINT[];      -- each held bucket's state as the items so far left it
    levels BIGINT[];
    rates BIGINT[];    -- the units per minute of the last item that moved it
    moved BOOLEAN[];
    slot INTEGER[];    -- per entry: its bucket's position in `held`
    drained_at BIGINT[];
    drained BIGINT[];
    held_at BIGINT;
    held_level BIGINT;
    clock_ms BIGINT;
    now_ms BIGINT;
    over BIGINT;
    longest BIGINT;
    first INTEGER := 1;
    b INTEGER;
    j INTEGER;
    k INTEGER;
BEGIN
    held := ARRAY(SELECT DISTINCT n FROM unnest(names) AS u (n) ORDER BY n);
    FOR b IN 1 .. cardinality(held) LOOP
        LOOP
            SELECT r.at_ms, r.level INTO held_at, held_level
                FROM rate_buckets AS r WHERE r.bucket = held[b] FOR UPDATE;
            EXIT WHEN FOUND;
            -- A new bucket starts full; concurrent first requests insert it once.
            INSERT INTO rate_buckets VALUES (held[b], 0, 0, 0) ON CONFLICT DO NOTHING;
        END LOOP;
        ats[b] := held_at;
        levels[b] := held_level;
        moved[b] := false;
    END LOOP;
    FOR j IN 1 .. cardinality(names) LOOP
        slot[j] := array_position(held, names[j]);
    END LOOP;
    clock_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT;
    FOR k IN 1 .. cardinality(sizes) LOOP
        now_ms := coalesce(at_us[k] / 1000, clock_ms);
        longest := 0;
        waits[k] := 0;
        refused[k] := -1;
        FOR j IN first .. first + sizes[k] - 1 LOOP
            b := slot[j];
            drained_at[j] := ats[b];
            drained[j] := levels[b];
            IF now_ms > ats[b] THEN
                drained[j] := greatest(0, levels[b] - least(
                    now_ms - ats[b], (levels[b] + per_minute[j] - 1) / per_minute[j]
                ) * per_minute[j]);
                drained_at[j] := now_ms;
            END IF;
            over := drained[j] + (units[j] - per_minute[j]) * 60000;
            IF NOT forced[k] AND over > 0
                    AND (over + per_minute[j] - 1) / per_minute[j] > longest THEN
                longest := (over + per_minute[j] - 1) / per_minute[j];
                refused[k] := j - first;
            END IF;
        END LOOP;
        IF longest > 0 THEN
            -- Refused: its buckets stay as they were, as a refused move writes nothing.
            waits[k] := (longest + 999) / 1000;
        ELSE
            FOR j IN first .. first + sizes[k] - 1 LOOP
                b := slot[j];
                ats[b] := drained_at[j];
                levels[b] := greatest(0, drained[j] + units[j] * 60000);
                rates[b] := per_minute[j];
                moved[b] := true;
            END LOOP;
        END IF;
        first := first + sizes[k];
    END LOOP;
    FOR b IN 1 .. cardinality(held) LOOP
        IF moved[b] THEN
            UPDATE rate_buckets
                SET at_ms = ats[b], level = levels[b],
                    empty_at_ms = ats[b] + (levels[b] + rates[b] - 1) / rates[b]
                WHERE bucket = held[b];
        END IF;
    END LOOP;
END
$$;
