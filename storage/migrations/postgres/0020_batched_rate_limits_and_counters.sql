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

-- A batch of receipts moves each project's and key's counters once (0015 moved them once
-- per receipt: the hot project row was updated three times a request in one transaction,
-- each update a new row version that the next one steps over). Within the batch's
-- transaction (`gateway.settling` on, set by this function alone) the triggers that moved
-- them per row leave it to the batch: `reservation_frees` (a deleted hold's amount out of
-- `reserved`) and `ledger_moves_balance` (a charge out of the balance, into the month's
-- spends). Every other trigger runs per row as before: the receipt consumes its hold or
-- shrinks its lease, writes its ledger charge, queues for the log. The counters are then
-- moved project by project and key by key, in id order (every batch locks them in one
-- order), each by the sums of the batch's items: the same final values as item by item,
-- and every CHECK (reserved >= 0, reserved <= balance) holds there if it held per item
-- (a settlement frees at least what it charges).
CREATE OR REPLACE FUNCTION reservation_frees() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('gateway.settling', true) = 'on' THEN
        RETURN NULL;  -- gateway_settle_many moves the counters for its batch
    END IF;
    UPDATE projects SET reserved = reserved - OLD.amount WHERE id = OLD.project_id;
    IF OLD.key_id IS NOT NULL THEN
        UPDATE api_keys SET reserved = reserved - OLD.amount WHERE id = OLD.key_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION ledger_moves_balance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'charge' AND current_setting('gateway.settling', true) = 'on' THEN
        RETURN NULL;  -- gateway_settle_many moves the counters for its batch
    END IF;
    UPDATE projects
    SET balance = balance + CASE NEW.kind WHEN 'credit' THEN NEW.amount ELSE -NEW.amount END
    WHERE id = NEW.project_id;
    IF NEW.kind = 'charge' THEN
        INSERT INTO month_spend AS m (subject, month, spent)
        VALUES (NEW.project_id, NEW.month, NEW.amount)
        ON CONFLICT (subject, month) DO UPDATE SET spent = m.spent + EXCLUDED.spent;
        IF NEW.key_id IS NOT NULL THEN
            INSERT INTO month_spend AS m (subject, month, spent)
            VALUES (NEW.key_id, NEW.month, NEW.amount)
            ON CONFLICT (subject, month) DO UPDATE SET spent = m.spent + EXCLUDED.spent;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- One answer per item, in order, as 0015's: true (charged), or false (its hold was gone
-- or did not cover the cost: nothing written).
CREATE OR REPLACE FUNCTION gateway_settle_many(batch jsonb) RETURNS boolean[]
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    g record;
    held BIGINT;
    leased BOOLEAN;
    answers boolean[] := '{}';
    projects_of TEXT[] := '{}';  -- per charged item
    keys_of TEXT[] := '{}';
    months TEXT[] := '{}';
    costs BIGINT[] := '{}';
    freed BIGINT[] := '{}';      -- the hold's amount, 0 for a lease's charge
BEGIN
    PERFORM set_config('gateway.settling', 'on', true);
    FOR r IN SELECT * FROM jsonb_to_recordset(batch) AS x(
        id text, reservation_id text, project_id text, key_id text, request_id text,
        kind text, endpoint text, model_or_runtime text, status text, usage jsonb,
        cost bigint, month text, created_at bigint, request_sha256 text,
        response_sha256 text, request_salt text, response_salt text,
        request_commitment text, response_commitment text, usage_source text,
        provider text)
    LOOP
        -- Inserted only while its hold is open and covers the cost; this locks the hold.
        SELECT h.amount, h.lease INTO held, leased FROM reservations h
            WHERE h.id = r.reservation_id AND h.project_id = r.project_id
              AND h.amount >= r.cost FOR UPDATE;
        IF FOUND THEN
            INSERT INTO receipts (id, reservation_id, project_id, key_id, request_id, kind,
                endpoint, model_or_runtime, status, usage, cost, month, created_at,
                request_sha256, response_sha256, request_salt, response_salt,
                request_commitment, response_commitment, usage_source, provider)
            VALUES (r.id, r.reservation_id, r.project_id, r.key_id, r.request_id, r.kind,
                r.endpoint, r.model_or_runtime, r.status, r.usage, r.cost, r.month,
                r.created_at, r.request_sha256, r.response_sha256, r.request_salt,
                r.response_salt, r.request_commitment, r.response_commitment,
                r.usage_source, r.provider);
            projects_of := projects_of || r.project_id;
            keys_of := keys_of || r.key_id;
            months := months || r.month;
            costs := costs || r.cost;
            freed := freed || CASE WHEN leased THEN 0 ELSE held END;
            answers := answers || true;
        ELSE
            answers := answers || false;
        END IF;
    END LOOP;
    FOR g IN SELECT u.p, sum(u.c) AS charged, sum(u.f) AS released
        FROM unnest(projects_of, costs, freed) AS u (p, c, f)
        GROUP BY u.p ORDER BY u.p COLLATE "C"
    LOOP
        UPDATE projects SET balance = balance - g.charged, reserved = reserved - g.released
            WHERE id = g.p;
    END LOOP;
    FOR g IN SELECT u.k, sum(u.f) AS released
        FROM unnest(keys_of, freed) AS u (k, f)
        WHERE u.k IS NOT NULL GROUP BY u.k ORDER BY u.k COLLATE "C"
    LOOP
        UPDATE api_keys SET reserved = reserved - g.released WHERE id = g.k;
    END LOOP;
    -- The month's spends: projects' first, then keys', as a receipt alone writes them.
    FOR g IN SELECT u.s, u.m, sum(u.c) AS charged
        FROM unnest(projects_of || keys_of, months || months, costs || costs) AS u (s, m, c)
        WHERE u.s IS NOT NULL GROUP BY u.s, u.m ORDER BY u.s LIKE 'key%', u.s COLLATE "C", u.m
    LOOP
        INSERT INTO month_spend AS m (subject, month, spent) VALUES (g.s, g.m, g.charged)
            ON CONFLICT (subject, month) DO UPDATE SET spent = m.spent + EXCLUDED.spent;
    END LOOP;
    PERFORM set_config('gateway.settling', 'off', true);
    RETURN answers;
END
$$;

-- A batch of holds is admitted whole when it fits whole: the batch locks each project,
-- then its keys, as the rows' triggers would (the items come sorted by project and key),
-- and checks every rule of `reservation_admits` with the batch's sum per project and per
-- key. A sum that fits means that every item, admitted one after the other, fits: the
-- holds are inserted with `reservation_admits` leaving it to the batch (`gateway.reserving`
-- on, within the batch's transaction), and each project's and key's `reserved` moves once
-- by its sum. A batch that does not fit whole (or spans months, or names a project or key
-- that does not exist) is inserted as in 0015, each row admitted by its trigger: an item
-- that does not fit aborts the batch and the items then go alone.
CREATE OR REPLACE FUNCTION reservation_admits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p projects%ROWTYPE;
    k api_keys%ROWTYPE;
    spent BIGINT;
BEGIN
    IF current_setting('gateway.reserving', true) = 'on' THEN
        RETURN NEW;  -- gateway_reserve_many admitted its batch whole, under these locks
    END IF;
    -- NO KEY UPDATE: the strongest lock that still lets other rows' foreign-key checks
    -- (which take KEY SHARE on the project) proceed; it excludes every other money change.
    SELECT * INTO p FROM projects WHERE id = NEW.project_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NEW;  -- the foreign key refuses the row
    END IF;
    IF NEW.key_id IS NOT NULL THEN
        SELECT * INTO k FROM api_keys WHERE id = NEW.key_id FOR NO KEY UPDATE;
        -- Each statement of this function reads a fresh snapshot, taken after the locks:
        -- the spend below includes every settlement committed before we got them.
        IF FOUND AND k.monthly_limit IS NOT NULL THEN
            SELECT COALESCE(max(m.spent), 0) INTO spent
            FROM month_spend m WHERE m.subject = k.id AND m.month = NEW.month;
            IF spent + k.reserved + NEW.amount > k.monthly_limit THEN
                RAISE EXCEPTION 'budget_exceeded' USING ERRCODE = 'GWL01';
            END IF;
        END IF;
    END IF;
    IF p.monthly_budget IS NOT NULL THEN
        SELECT COALESCE(max(m.spent), 0) INTO spent
        FROM month_spend m WHERE m.subject = p.id AND m.month = NEW.month;
        IF spent + p.reserved + NEW.amount > p.monthly_budget THEN
            RAISE EXCEPTION 'budget_exceeded' USING ERRCODE = 'GWL01';
        END IF;
    END IF;
    IF p.balance - p.reserved < NEW.amount THEN
        RAISE EXCEPTION 'insufficient_balance' USING ERRCODE = 'GWL01';
    END IF;
    UPDATE projects SET reserved = reserved + NEW.amount WHERE id = NEW.project_id;
    IF NEW.key_id IS NOT NULL THEN
        UPDATE api_keys SET reserved = reserved + NEW.amount WHERE id = NEW.key_id;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION gateway_reserve_many(batch jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    g record;
    p projects%ROWTYPE;
    k api_keys%ROWTYPE;
    spent BIGINT;
    month_of TEXT;
    whole BOOLEAN := true;
BEGIN
    SELECT min(x.month), count(DISTINCT x.month) = 1 INTO month_of, whole
        FROM jsonb_to_recordset(batch) AS x(month text);
    -- Locks in the triggers' order: a project, then its keys; sums per project and key.
    FOR g IN
        SELECT s.pid, s.kid, s.project_sum, s.key_sum,
            row_number() OVER (PARTITION BY s.pid ORDER BY s.kid COLLATE "C" NULLS FIRST) = 1
                AS first_of_project
        FROM (SELECT DISTINCT x.project_id AS pid, x.key_id AS kid,
                  sum(x.amount) OVER (PARTITION BY x.project_id) AS project_sum,
                  sum(x.amount) OVER (PARTITION BY x.key_id) AS key_sum
              FROM jsonb_to_recordset(batch) AS x(project_id text, key_id text, amount bigint)
             ) AS s
        ORDER BY s.pid COLLATE "C", s.kid COLLATE "C" NULLS FIRST
    LOOP
        EXIT WHEN NOT whole;
        IF g.first_of_project THEN
            SELECT * INTO p FROM projects WHERE id = g.pid FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                whole := false;
                EXIT;
            END IF;
            IF p.monthly_budget IS NOT NULL THEN
                SELECT COALESCE(max(m.spent), 0) INTO spent
                FROM month_spend m WHERE m.subject = p.id AND m.month = month_of;
                whole := whole AND spent + p.reserved + g.project_sum <= p.monthly_budget;
            END IF;
            whole := whole AND p.balance - p.reserved >= g.project_sum;
        END IF;
        IF g.kid IS NOT NULL THEN
            SELECT * INTO k FROM api_keys WHERE id = g.kid FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                whole := false;
            ELSIF k.monthly_limit IS NOT NULL THEN
                SELECT COALESCE(max(m.spent), 0) INTO spent
                FROM month_spend m WHERE m.subject = k.id AND m.month = month_of;
                whole := whole AND spent + k.reserved + g.key_sum <= k.monthly_limit;
            END IF;
        END IF;
    END LOOP;
    IF whole THEN
        PERFORM set_config('gateway.reserving', 'on', true);
    END IF;
    INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,
                              created_at)
    SELECT id, project_id, key_id, amount, month, owner, lease_until, created_at
    FROM jsonb_to_recordset(batch) AS x(
        id text, project_id text, key_id text, amount bigint, month text, owner text,
        lease_until bigint, created_at bigint);
    IF NOT whole THEN
        RETURN;  -- each row admitted by its trigger, as in 0015
    END IF;
    PERFORM set_config('gateway.reserving', 'off', true);
    FOR g IN SELECT x.project_id AS id, sum(x.amount) AS amount
        FROM jsonb_to_recordset(batch) AS x(project_id text, amount bigint)
        GROUP BY x.project_id ORDER BY x.project_id COLLATE "C"
    LOOP
        UPDATE projects SET reserved = reserved + g.amount WHERE id = g.id;
    END LOOP;
    FOR g IN SELECT x.key_id AS id, sum(x.amount) AS amount
        FROM jsonb_to_recordset(batch) AS x(key_id text, amount bigint)
        WHERE x.key_id IS NOT NULL GROUP BY x.key_id ORDER BY x.key_id COLLATE "C"
    LOOP
        UPDATE api_keys SET reserved = reserved + g.amount WHERE id = g.id;
    END LOOP;
END
$$;
