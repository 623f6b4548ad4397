-- Compact receipts (issue 14: a few hundred bytes a request, nothing stored twice).
--
-- receipt_rows holds what only the receipt knows, in binary where it was hex:
--   - ids of the gateway's own form (`rcpt_`/`rsv_`/`prj_`/`key_`/`req_` + lowercase hex)
--     as the bytes of their hex part; any other id as text, unchanged;
--   - digests, salts and commitments (lowercase hex) as their bytes; other text unchanged;
--   - the labels a receipt shares with many others (kind, endpoint, model or runtime,
--     status, usage source, provider) once in receipt_shapes;
--   - usage: input and output tokens as integers, any other count as JSON (NULL: none);
--   - month NULL when it is the UTC month of created_at (a hold taken in one month and
--     settled in the next keeps its month);
--   - response_commitment NULL when it is SHA-256(response_salt || response_sha256),
--     which it always is on receipts the gateway issues: the storage rebuilds it.
-- The storage converts at its boundary (storage/sqlite.py: _pack, _receipt): ReceiptRecord
-- is unchanged. The view `receipts` shows the old columns, in text, to SQL readers
-- (response_commitment as stored). Existing rows are converted by functions the
-- migration runner registers (gateway_pack, gateway_usage, gateway_response_commitment).
--
-- Nothing stored twice:
--   - a charge's ledger row is its id and its receipt (`receipt`, the receipt's seq); its
--     project, key, amount, month and time are the receipt's. The settlement's trigger
--     moves the balance and the month's spend itself; ledger_moves_balance moves them for
--     the other rows (credits; charges written before this migration that do not match
--     their receipt stay whole). A charge's ledger id grows with its receipt's seq (both
--     are assigned by the one statement that inserts the receipt), which lets a ledger
--     page find its charges through the receipts' project index.
--   - log_entries names its receipt by seq; log_leaves (leaves logged before tiles,
--     frozen) keeps its text ids and loses its foreign key (it pointed at the table
--     replaced here);
--   - a key's last use is kept on the key by the settlement's trigger, not by an index
--     over every receipt.

CREATE TABLE receipt_shapes (
    id               INTEGER PRIMARY KEY,
    kind             TEXT NOT NULL,
    endpoint         TEXT NOT NULL,
    model_or_runtime TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    usage_source     TEXT NOT NULL CHECK (usage_source IN ('provider', 'gateway')),
    provider         TEXT
);
-- x'' stands for a missing provider: a blob never equals a provider's text.
CREATE UNIQUE INDEX receipt_shapes_unique ON receipt_shapes
    (kind, endpoint, model_or_runtime, status, usage_source, coalesce(provider, x''));

INSERT INTO receipt_shapes (kind, endpoint, model_or_runtime, status, usage_source, provider)
SELECT DISTINCT kind, endpoint, model_or_runtime, status, usage_source, provider FROM receipts;

CREATE TABLE receipt_rows (
    seq                 INTEGER PRIMARY KEY,  -- issue order: cursors, and the log's order
    id                  NOT NULL UNIQUE,
    reservation_id      NOT NULL,
    project_id          NOT NULL,  -- its project is checked through the hold (receipt_needs_hold)
    key_id,
    request_id          NOT NULL,
    shape               INTEGER NOT NULL REFERENCES receipt_shapes (id),
    input_tokens        INTEGER,
    output_tokens       INTEGER,
    usage_rest          TEXT,
    cost                INTEGER NOT NULL CHECK (cost >= 0),
    month               TEXT,
    created_at          INTEGER NOT NULL,  -- unix microseconds
    request_sha256      NOT NULL,
    response_sha256     NOT NULL,
    request_salt,
    response_salt,
    request_commitment,
    response_commitment
);

INSERT INTO receipt_rows
SELECT r.rowid,
    gateway_pack('rcpt_', r.id),
    gateway_pack('rsv_', r.reservation_id),
    gateway_pack('prj_', r.project_id),
    gateway_pack('key_', r.key_id),
    gateway_pack('req_', r.request_id),
    (SELECT s.id FROM receipt_shapes s
     WHERE s.kind = r.kind AND s.endpoint = r.endpoint AND s.model_or_runtime = r.model_or_runtime
       AND s.status = r.status AND s.usage_source = r.usage_source AND s.provider IS r.provider),
    gateway_usage(r.usage, 'input_tokens'),
    gateway_usage(r.usage, 'output_tokens'),
    gateway_usage(r.usage, NULL),
    r.cost,
    nullif(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')),
    r.created_at,
    gateway_pack('', r.request_sha256),
    gateway_pack('', r.response_sha256),
    gateway_pack('', r.request_salt),
    gateway_pack('', r.response_salt),
    gateway_pack('', r.request_commitment),
    CASE WHEN r.response_commitment
              = gateway_response_commitment(r.response_salt, r.response_sha256)
         THEN NULL ELSE gateway_pack('', r.response_commitment) END
FROM receipts r ORDER BY r.rowid;

CREATE INDEX receipt_rows_project ON receipt_rows (project_id);  -- then seq, implicitly

-- The log's tables, rebuilt to point at receipt_rows (the 12-step procedure; the runner
-- checks foreign keys before commit).
CREATE TABLE log_entries_new (
    leaf_index INTEGER PRIMARY KEY,
    receipt    INTEGER NOT NULL REFERENCES receipt_rows (seq)
);
INSERT INTO log_entries_new
SELECT e.leaf_index, r.seq FROM log_entries e
JOIN receipt_rows r ON r.id = gateway_pack('rcpt_', e.receipt_id);
DROP TABLE log_entries;
ALTER TABLE log_entries_new RENAME TO log_entries;
CREATE UNIQUE INDEX log_entries_receipt ON log_entries (receipt);

CREATE TABLE log_leaves_new (
    leaf_index     INTEGER PRIMARY KEY,
    receipt_id     TEXT NOT NULL UNIQUE,
    public_receipt BLOB NOT NULL,
    signature      TEXT NOT NULL
);
INSERT INTO log_leaves_new SELECT leaf_index, receipt_id, public_receipt, signature FROM log_leaves;
DROP TABLE log_leaves;
ALTER TABLE log_leaves_new RENAME TO log_leaves;

DROP TABLE receipts;

-- The ledger, rebuilt under its own name (payments and purchases point at it).
CREATE TABLE ledger_new (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
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
INSERT INTO ledger_new
SELECT l.id,
    CASE WHEN r.seq IS NULL THEN l.project_id END,
    CASE WHEN r.seq IS NULL THEN l.key_id END,
    l.kind,
    CASE WHEN r.seq IS NULL THEN l.amount END,
    CASE WHEN r.seq IS NULL THEN l.month END,
    CASE WHEN r.seq IS NULL THEN gateway_pack('rcpt_', l.receipt_id) END,
    CASE WHEN r.seq IS NULL THEN l.created_at END,
    r.seq
FROM ledger l LEFT JOIN receipt_rows r
    ON l.kind = 'charge' AND r.id = gateway_pack('rcpt_', l.receipt_id)
   AND r.project_id = gateway_pack('prj_', l.project_id)
   AND r.key_id IS gateway_pack('key_', l.key_id) AND r.cost = l.amount
   AND coalesce(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')) = l.month
   AND r.created_at / 1000000 = l.created_at
ORDER BY l.id;
DROP TABLE ledger;
ALTER TABLE ledger_new RENAME TO ledger;
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

CREATE TRIGGER log_is_append_only BEFORE UPDATE ON log_leaves
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_leaves_are_never_deleted BEFORE DELETE ON log_leaves
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_entries_are_append_only BEFORE UPDATE ON log_entries
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_entries_are_never_deleted BEFORE DELETE ON log_entries
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;

ALTER TABLE api_keys ADD COLUMN last_used_us INTEGER;  -- its latest receipt's created_at
UPDATE api_keys SET last_used_us = (
    SELECT max(r.created_at) FROM receipt_rows r WHERE r.key_id = gateway_pack('key_', api_keys.id)
);

-- The money triggers of 0002/0005/0007, on receipt_rows; ids compared in their text form.
CREATE TRIGGER receipt_needs_hold BEFORE INSERT ON receipt_rows
BEGIN
    SELECT RAISE(ABORT, 'reservation_gone')
    WHERE NOT EXISTS (
        SELECT 1 FROM reservations r
        WHERE r.id = (CASE typeof(NEW.reservation_id) WHEN 'blob'
                      THEN 'rsv_' || lower(hex(NEW.reservation_id)) ELSE NEW.reservation_id END)
          AND r.project_id = (CASE typeof(NEW.project_id) WHEN 'blob'
                      THEN 'prj_' || lower(hex(NEW.project_id)) ELSE NEW.project_id END)
          AND r.amount >= NEW.cost
    );
END;

-- The charge: its ledger row names the receipt; the balance and the month's spend move here.
CREATE TRIGGER receipt_charges AFTER INSERT ON receipt_rows
BEGIN
    DELETE FROM reservations WHERE id = (CASE typeof(NEW.reservation_id) WHEN 'blob'
        THEN 'rsv_' || lower(hex(NEW.reservation_id)) ELSE NEW.reservation_id END);
    UPDATE projects SET balance = balance - NEW.cost
    WHERE id = (CASE typeof(NEW.project_id) WHEN 'blob'
                THEN 'prj_' || lower(hex(NEW.project_id)) ELSE NEW.project_id END);
    INSERT INTO month_spend (subject, month, spent)
    SELECT CASE typeof(NEW.project_id) WHEN 'blob'
               THEN 'prj_' || lower(hex(NEW.project_id)) ELSE NEW.project_id END,
           coalesce(NEW.month, strftime('%Y-%m', NEW.created_at / 1000000, 'unixepoch')),
           NEW.cost
    WHERE true
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
    INSERT INTO month_spend (subject, month, spent)
    SELECT CASE typeof(NEW.key_id) WHEN 'blob'
               THEN 'key_' || lower(hex(NEW.key_id)) ELSE NEW.key_id END,
           coalesce(NEW.month, strftime('%Y-%m', NEW.created_at / 1000000, 'unixepoch')),
           NEW.cost
    WHERE NEW.key_id IS NOT NULL
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
    INSERT INTO ledger (kind, receipt) VALUES ('charge', NEW.seq);
    UPDATE api_keys SET last_used_us = max(coalesce(last_used_us, 0), NEW.created_at)
    WHERE id = (CASE typeof(NEW.key_id) WHEN 'blob'
                THEN 'key_' || lower(hex(NEW.key_id)) ELSE NEW.key_id END);
END;

CREATE TRIGGER receipt_settles_agent_step AFTER INSERT ON receipt_rows
WHEN NEW.key_id IS NULL
BEGIN
    UPDATE agent_steps SET state = 'settled', cost = NEW.cost,
        receipt_id = (CASE typeof(NEW.id) WHEN 'blob'
                      THEN 'rcpt_' || lower(hex(NEW.id)) ELSE NEW.id END)
    WHERE reservation_id = (CASE typeof(NEW.reservation_id) WHEN 'blob'
                            THEN 'rsv_' || lower(hex(NEW.reservation_id)) ELSE NEW.reservation_id END)
      AND state <> 'settled';
END;

-- The old columns, in text, for SQL readers (and the storage's own reads).
CREATE VIEW receipts AS
SELECT r.seq AS seq,
    CASE typeof(r.id) WHEN 'blob' THEN 'rcpt_' || lower(hex(r.id)) ELSE r.id END AS id,
    CASE typeof(r.reservation_id) WHEN 'blob'
        THEN 'rsv_' || lower(hex(r.reservation_id)) ELSE r.reservation_id END AS reservation_id,
    CASE typeof(r.project_id) WHEN 'blob'
        THEN 'prj_' || lower(hex(r.project_id)) ELSE r.project_id END AS project_id,
    CASE typeof(r.key_id) WHEN 'blob'
        THEN 'key_' || lower(hex(r.key_id)) ELSE r.key_id END AS key_id,
    CASE typeof(r.request_id) WHEN 'blob'
        THEN 'req_' || lower(hex(r.request_id)) ELSE r.request_id END AS request_id,
    s.kind, s.endpoint, s.model_or_runtime, s.status,
    json_patch(json_patch(coalesce(r.usage_rest, '{}'),
        CASE WHEN r.input_tokens IS NULL THEN '{}'
             ELSE json_object('input_tokens', r.input_tokens) END),
        CASE WHEN r.output_tokens IS NULL THEN '{}'
             ELSE json_object('output_tokens', r.output_tokens) END) AS usage,
    r.cost,
    coalesce(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')) AS month,
    r.created_at,
    CASE typeof(r.request_sha256) WHEN 'blob'
        THEN lower(hex(r.request_sha256)) ELSE r.request_sha256 END AS request_sha256,
    CASE typeof(r.response_sha256) WHEN 'blob'
        THEN lower(hex(r.response_sha256)) ELSE r.response_sha256 END AS response_sha256,
    CASE typeof(r.request_salt) WHEN 'blob'
        THEN lower(hex(r.request_salt)) ELSE r.request_salt END AS request_salt,
    CASE typeof(r.response_salt) WHEN 'blob'
        THEN lower(hex(r.response_salt)) ELSE r.response_salt END AS response_salt,
    CASE typeof(r.request_commitment) WHEN 'blob'
        THEN lower(hex(r.request_commitment)) ELSE r.request_commitment END AS request_commitment,
    CASE typeof(r.response_commitment) WHEN 'blob'
        THEN lower(hex(r.response_commitment)) ELSE r.response_commitment END
        AS response_commitment,
    s.usage_source, s.provider
FROM receipt_rows r JOIN receipt_shapes s ON s.id = r.shape;

-- An UPDATE of the view's cost reaches the row (what an operator, or a tamper test, does).
CREATE TRIGGER receipts_update_cost INSTEAD OF UPDATE OF cost ON receipts
BEGIN
    UPDATE receipt_rows SET cost = NEW.cost WHERE seq = OLD.seq;
END;
