-- Receipt status `cancelled`: the client left after the upstream accepted the request, or
-- during a sandbox run; billed for what ran (decisions.md, "Hardening decisions").
-- SQLite cannot change a CHECK in place: the table is rebuilt (the documented 12-step
-- procedure), with its index and triggers recreated as 0002 made them. The migration
-- runs with foreign keys off; the runner checks them (log_leaves -> receipts) before commit.

CREATE TABLE receipts_new (
    id              TEXT PRIMARY KEY,
    reservation_id  TEXT NOT NULL,
    project_id      TEXT NOT NULL REFERENCES projects (id),
    key_id          TEXT,
    request_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    model_or_runtime TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    usage           TEXT NOT NULL,  -- JSON object of integer counts
    cost            INTEGER NOT NULL CHECK (cost >= 0),
    month           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,  -- unix microseconds
    request_sha256  TEXT NOT NULL,
    response_sha256 TEXT NOT NULL,
    request_salt    TEXT,
    response_salt   TEXT,
    request_commitment TEXT,
    response_commitment TEXT,
    usage_source    TEXT NOT NULL DEFAULT 'provider' CHECK (usage_source IN ('provider', 'gateway'))
);

INSERT INTO receipts_new SELECT
    id, reservation_id, project_id, key_id, request_id, kind, endpoint, model_or_runtime,
    status, usage, cost, month, created_at, request_sha256, response_sha256, request_salt,
    response_salt, request_commitment, response_commitment, usage_source
FROM receipts;

DROP TABLE receipts;
ALTER TABLE receipts_new RENAME TO receipts;
CREATE INDEX receipts_project ON receipts (project_id);

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
