-- Fewer pages written per request (each commit writes every page it changed to the WAL;
-- measured on the request path's own statements: a hold 5 -> 3 pages, a receipt 12 -> 9).
--
-- Holds: `reservations` only ever holds the open holds and leases, a handful of rows, so
-- it needs no index beyond its key. Stored WITHOUT ROWID, that key is the table itself
-- (no separate index page); the owner's holds, renewed every few seconds, are found by a
-- scan of those few rows.
-- SQLite rebuilds a table to change its storage, and a dropped table takes its triggers
-- with it: those of 0002, 0007 and 0012 are restated unchanged. The legacy rename leaves
-- the triggers of other tables that name a rebuilt table as they are (by then it exists
-- again under that name); the modern one would re-check them while it is missing.
PRAGMA legacy_alter_table = ON;
CREATE TABLE reservations_new (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    key_id      TEXT REFERENCES api_keys (id),
    amount      INTEGER NOT NULL CHECK (amount >= 0),
    month       TEXT NOT NULL,
    owner       TEXT NOT NULL,  -- the serving process: host:pid:start-time
    lease_until INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    lease       INTEGER NOT NULL DEFAULT 0 CHECK (lease IN (0, 1)),
    recalled    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
INSERT INTO reservations_new
SELECT id, project_id, key_id, amount, month, owner, lease_until, created_at, lease, recalled
FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_new RENAME TO reservations;
CREATE INDEX reservations_leases ON reservations (project_id) WHERE lease = 1;

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

CREATE TRIGGER reservation_releases_agent_step AFTER DELETE ON reservations
WHEN OLD.key_id IS NULL
BEGIN
    UPDATE agent_steps SET state = 'released'
    WHERE reservation_id = OLD.id AND state = 'in_flight';
END;

CREATE TRIGGER lease_counts AFTER INSERT ON reservations WHEN NEW.lease = 1
BEGIN
    UPDATE projects SET leased = leased + NEW.amount WHERE id = NEW.project_id;
    UPDATE api_keys SET leased = leased + NEW.amount WHERE id = NEW.key_id;
END;

CREATE TRIGGER lease_ends AFTER DELETE ON reservations WHEN OLD.lease = 1
BEGIN
    UPDATE projects SET leased = leased - OLD.amount WHERE id = OLD.project_id;
    UPDATE api_keys SET leased = leased - OLD.amount WHERE id = OLD.key_id;
END;

-- A hold is fixed at admission; a lease may only shrink.
CREATE TRIGGER lease_only_shrinks BEFORE UPDATE OF amount, lease ON reservations
BEGIN
    SELECT RAISE(ABORT, 'hold_is_fixed')
    WHERE OLD.lease = 0 OR NEW.lease <> OLD.lease OR NEW.amount > OLD.amount;
END;

CREATE TRIGGER lease_shrinks AFTER UPDATE OF amount ON reservations
BEGIN
    UPDATE projects
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.project_id;
    UPDATE api_keys
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.key_id;
END;

-- The ledger without AUTOINCREMENT, which writes its counter row in sqlite_sequence on
-- every insert. Ledger rows are never deleted (now enforced), so the next id is the
-- largest plus one, as before: existing ids are kept. Rebuilt under its own name
-- (payments and purchases point at it), as 0011 did.
CREATE TABLE ledger_new (
    id         INTEGER PRIMARY KEY,
    project_id TEXT REFERENCES projects (id),
    key_id     TEXT REFERENCES api_keys (id),
    kind       TEXT NOT NULL CHECK (kind IN ('credit', 'charge')),
    amount     INTEGER CHECK (amount >= 0),
    month      TEXT,
    receipt_id,  -- a whole charge's receipt, packed as receipt_rows.id
    created_at INTEGER,
    receipt    INTEGER REFERENCES receipt_rows (seq),  -- a charge told by its receipt
    CHECK (CASE WHEN receipt IS NULL
           THEN project_id IS NOT NULL AND amount IS NOT NULL AND month IS NOT NULL
                AND created_at IS NOT NULL
           ELSE kind = 'charge' AND project_id IS NULL AND key_id IS NULL AND amount IS NULL
                AND month IS NULL AND receipt_id IS NULL AND created_at IS NULL END)
);
INSERT INTO ledger_new SELECT * FROM ledger ORDER BY id;
DROP TABLE ledger;
ALTER TABLE ledger_new RENAME TO ledger;
DELETE FROM sqlite_sequence WHERE name = 'ledger';
CREATE INDEX ledger_project ON ledger (project_id) WHERE project_id IS NOT NULL;
CREATE UNIQUE INDEX ledger_receipt ON ledger (receipt) WHERE receipt IS NOT NULL;
CREATE TRIGGER ledger_moves_balance AFTER INSERT ON ledger
WHEN NEW.receipt IS NULL
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
CREATE TRIGGER ledger_is_append_only BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;

PRAGMA legacy_alter_table = OFF;
