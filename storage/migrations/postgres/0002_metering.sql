-- Money is integer micro-units. The counters are kept by triggers in the statement that
-- changes their source rows, so the invariants hold for every writer and every process:
--   projects.balance  = credits - charges in ledger
--   projects.reserved = sum of the project's open reservations (api_keys.reserved: the key's)
--   month_spend       = charges per project and per key per UTC month ('YYYY-MM')
--
-- Concurrency (READ COMMITTED, any number of writers): every change to a project's money,
-- and to its keys', first locks the project row, then the key row; never the other way
-- round, so there is no deadlock. A reservation's checks run after those locks are held,
-- so they read numbers no other transaction can change before this one commits: there is
-- no window between check and hold. Each statement below is atomic: a refusal (RAISE)
-- undoes everything the statement did.
-- Custom SQLSTATEs, translated by storage/postgres.py:
--   GWL01  a reservation was refused; the message is the reason
--   GWR01  settlement found no open hold to consume (gone, or smaller than the cost)
--   GWC01  a change the rules forbid (append-only rows)

ALTER TABLE projects ADD COLUMN balance BIGINT NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0);
ALTER TABLE api_keys ADD COLUMN reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0);
-- Holds are admitted within the available balance and charges never exceed their hold, so
-- this can only fail on a bug: then the statement fails instead of overspending.
ALTER TABLE projects ADD CONSTRAINT projects_never_overspent CHECK (reserved <= balance);

CREATE TABLE ledger (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    key_id     TEXT REFERENCES api_keys (id),
    kind       TEXT NOT NULL CHECK (kind IN ('credit', 'charge')),
    amount     BIGINT NOT NULL CHECK (amount >= 0),
    month      TEXT NOT NULL,
    receipt_id TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX ledger_project ON ledger (project_id, kind, month);

CREATE TABLE month_spend (
    subject TEXT NOT NULL,  -- a project id or a key id
    month   TEXT NOT NULL,
    spent   BIGINT NOT NULL,
    PRIMARY KEY (subject, month)
);

CREATE TABLE reservations (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    key_id      TEXT REFERENCES api_keys (id),
    amount      BIGINT NOT NULL CHECK (amount >= 0),
    month       TEXT NOT NULL,
    owner       TEXT NOT NULL,  -- the serving process: host:pid:start-time
    lease_until BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX reservations_owner ON reservations (owner);
CREATE INDEX reservations_lease ON reservations (lease_until);
CREATE INDEX reservations_project ON reservations (project_id);

CREATE TABLE receipts (
    id               TEXT PRIMARY KEY,
    seq              BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,  -- issue order
    reservation_id   TEXT NOT NULL,
    project_id       TEXT NOT NULL REFERENCES projects (id),
    key_id           TEXT,
    request_id       TEXT NOT NULL,
    kind             TEXT NOT NULL,
    endpoint         TEXT NOT NULL,
    model_or_runtime TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('succeeded', 'failed')),
    usage            JSONB NOT NULL,  -- object of integer counts
    cost             BIGINT NOT NULL CHECK (cost >= 0),
    month            TEXT NOT NULL,
    created_at       BIGINT NOT NULL,  -- unix microseconds
    request_sha256   TEXT NOT NULL,
    response_sha256  TEXT NOT NULL
);
CREATE INDEX receipts_project ON receipts (project_id);

CREATE FUNCTION gateway_forbidden() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% of % rows is not allowed', TG_OP, TG_TABLE_NAME USING ERRCODE = 'GWC01';
END
$$;

-- The ledger is the source of the balance: rows are only ever appended.
CREATE TRIGGER ledger_is_append_only BEFORE UPDATE OR DELETE ON ledger
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();

CREATE FUNCTION ledger_moves_balance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER ledger_moves_balance AFTER INSERT ON ledger
FOR EACH ROW EXECUTE FUNCTION ledger_moves_balance();

-- The admission check and the hold are one statement, under the project's and the key's
-- row locks: no request of any process can slip between them.
CREATE FUNCTION reservation_admits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p projects%ROWTYPE;
    k api_keys%ROWTYPE;
    spent BIGINT;
BEGIN
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

CREATE TRIGGER reservation_admits BEFORE INSERT ON reservations
FOR EACH ROW EXECUTE FUNCTION reservation_admits();

CREATE FUNCTION reservation_frees() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE projects SET reserved = reserved - OLD.amount WHERE id = OLD.project_id;
    IF OLD.key_id IS NOT NULL THEN
        UPDATE api_keys SET reserved = reserved - OLD.amount WHERE id = OLD.key_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER reservation_frees AFTER DELETE ON reservations
FOR EACH ROW EXECUTE FUNCTION reservation_frees();

-- A hold changes only its lease; what it holds, and for whom, is fixed at admission.
CREATE TRIGGER reservation_is_fixed
BEFORE UPDATE OF id, project_id, key_id, amount, month ON reservations
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();

-- Settlement is the receipt's insertion: it consumes its reservation exactly once (the
-- DELETE locks the row, so a concurrent second settlement waits, then finds it gone) and
-- charges at most the hold.
CREATE FUNCTION receipt_consumes_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reservations r
    WHERE r.id = NEW.reservation_id AND r.project_id = NEW.project_id AND r.amount >= NEW.cost;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reservation_gone' USING ERRCODE = 'GWR01';
    END IF;
    INSERT INTO ledger (project_id, key_id, kind, amount, month, receipt_id, created_at)
    VALUES (NEW.project_id, NEW.key_id, 'charge', NEW.cost, NEW.month, NEW.id,
            NEW.created_at / 1000000);
    RETURN NEW;
END
$$;

CREATE TRIGGER receipt_consumes_hold BEFORE INSERT ON receipts
FOR EACH ROW EXECUTE FUNCTION receipt_consumes_hold();

CREATE TRIGGER receipts_are_final BEFORE UPDATE OR DELETE ON receipts
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();
