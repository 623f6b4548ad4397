-- Money is integer micro-units. Counters below are kept by triggers in the same statement
-- that changes their source rows, so the invariants hold for every writer:
--   projects.balance  = credits - charges in ledger
--   projects.reserved = sum of the project's open reservations (api_keys.reserved: the key's)
--   month_spend       = charges per project and per key per UTC month ('YYYY-MM')

ALTER TABLE projects ADD COLUMN balance INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0);
ALTER TABLE api_keys ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0);

CREATE TABLE ledger (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id TEXT NOT NULL REFERENCES projects (id),
    key_id     TEXT REFERENCES api_keys (id),
    kind       TEXT NOT NULL CHECK (kind IN ('credit', 'charge')),
    amount     INTEGER NOT NULL CHECK (amount >= 0),
    month      TEXT NOT NULL,
    receipt_id TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX ledger_project ON ledger (project_id);

CREATE TABLE month_spend (
    subject TEXT NOT NULL,  -- a project id or a key id
    month   TEXT NOT NULL,
    spent   INTEGER NOT NULL,
    PRIMARY KEY (subject, month)
);

CREATE TABLE reservations (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    key_id      TEXT REFERENCES api_keys (id),
    amount      INTEGER NOT NULL CHECK (amount >= 0),
    month       TEXT NOT NULL,
    owner       TEXT NOT NULL,  -- the serving process: host:pid:start-time
    lease_until INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX reservations_owner ON reservations (owner);

CREATE TABLE receipts (
    id              TEXT PRIMARY KEY,
    reservation_id  TEXT NOT NULL,
    project_id      TEXT NOT NULL REFERENCES projects (id),
    key_id          TEXT,
    request_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    model_or_runtime TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('succeeded', 'failed')),
    usage           TEXT NOT NULL,  -- JSON object of integer counts
    cost            INTEGER NOT NULL CHECK (cost >= 0),
    month           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,  -- unix microseconds
    request_sha256  TEXT NOT NULL,
    response_sha256 TEXT NOT NULL
);
CREATE INDEX receipts_project ON receipts (project_id);

CREATE TRIGGER ledger_moves_balance AFTER INSERT ON ledger
BEGIN
    UPDATE projects
    SET balance = balance + CASE NEW.kind WHEN 'credit' THEN NEW.amount ELSE -NEW.amount END
    WHERE id = NEW.project_id;
    INSERT INTO month_spend (subject, month, spent)
    SELECT NEW.project_id, NEW.month, NEW.amount WHERE NEW.kind = 'charge'
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
    INSERT INTO month_spend (subject, month, spent)
    SELECT NEW.key_id, NEW.month, NEW.amount WHERE NEW.kind = 'charge' AND NEW.key_id IS NOT NULL
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
END;

-- The admission check and the hold are one statement: no request can slip between them.
CREATE TRIGGER reservation_admits BEFORE INSERT ON reservations
BEGIN
    SELECT RAISE(ABORT, 'budget_exceeded')
    FROM api_keys k
    WHERE k.id = NEW.key_id AND k.monthly_limit IS NOT NULL
      AND COALESCE((SELECT spent FROM month_spend WHERE subject = k.id AND month = NEW.month), 0)
          + k.reserved + NEW.amount > k.monthly_limit;
    SELECT RAISE(ABORT, 'budget_exceeded')
    FROM projects p
    WHERE p.id = NEW.project_id AND p.monthly_budget IS NOT NULL
      AND COALESCE((SELECT spent FROM month_spend WHERE subject = p.id AND month = NEW.month), 0)
          + p.reserved + NEW.amount > p.monthly_budget;
    SELECT RAISE(ABORT, 'insufficient_balance')
    FROM projects p
    WHERE p.id = NEW.project_id AND p.balance - p.reserved < NEW.amount;
END;

CREATE TRIGGER reservation_holds AFTER INSERT ON reservations
BEGIN
    UPDATE projects SET reserved = reserved + NEW.amount WHERE id = NEW.project_id;
    UPDATE api_keys SET reserved = reserved + NEW.amount WHERE id = NEW.key_id;
END;

CREATE TRIGGER reservation_frees AFTER DELETE ON reservations
BEGIN
    UPDATE projects SET reserved = reserved - OLD.amount WHERE id = OLD.project_id;
    UPDATE api_keys SET reserved = reserved - OLD.amount WHERE id = OLD.key_id;
END;

-- Settlement is the receipt's insertion: it consumes its reservation exactly once (a
-- second settlement, or one after the hold was swept, aborts) and charges at most the hold.
CREATE TRIGGER receipt_needs_hold BEFORE INSERT ON receipts
BEGIN
    SELECT RAISE(ABORT, 'reservation_gone')
    WHERE NOT EXISTS (
        SELECT 1 FROM reservations r
        WHERE r.id = NEW.reservation_id AND r.project_id = NEW.project_id AND r.amount >= NEW.cost
    );
END;

CREATE TRIGGER receipt_charges AFTER INSERT ON receipts
BEGIN
    DELETE FROM reservations WHERE id = NEW.reservation_id;
    INSERT INTO ledger (project_id, key_id, kind, amount, month, receipt_id, created_at)
    VALUES (NEW.project_id, NEW.key_id, 'charge', NEW.cost, NEW.month, NEW.id, NEW.created_at / 1000000);
END;
