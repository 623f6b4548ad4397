-- Main's SQLite migrations 0004 (receipt commitments), 0005 (receipt statuses), 0006 (the
-- console) and 0008 (the log as tiles) for PostgreSQL, in one step. The agents (SQLite
-- 0007) are not migrated here: the agents engine is unavailable on PostgreSQL for now.

-- Public receipt v2: salted commitments instead of plain digests, and who counted usage.
ALTER TABLE receipts ADD COLUMN request_salt TEXT;
ALTER TABLE receipts ADD COLUMN response_salt TEXT;
ALTER TABLE receipts ADD COLUMN request_commitment TEXT;
ALTER TABLE receipts ADD COLUMN response_commitment TEXT;
ALTER TABLE receipts ADD COLUMN usage_source TEXT NOT NULL DEFAULT 'provider'
    CHECK (usage_source IN ('provider', 'gateway'));
-- Receipt status `cancelled` (the client left after the upstream accepted the request).
ALTER TABLE receipts DROP CONSTRAINT receipts_status_check;
ALTER TABLE receipts ADD CONSTRAINT receipts_status_check
    CHECK (status IN ('succeeded', 'failed', 'cancelled'));

-- Insertion order, SQLite's rowid: ties of created_at are listed newest first by it.
ALTER TABLE projects ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE api_keys ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE sandboxes ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
CREATE INDEX sandboxes_project ON sandboxes (project_id);

-- The console: users, grants, sessions, the sign-in throttle, payments, purchases.
CREATE TABLE users (
    id            TEXT PRIMARY KEY,
    seq           BIGINT GENERATED ALWAYS AS IDENTITY,
    email         TEXT NOT NULL,
    password_hash TEXT NOT NULL,    -- argon2id, PHC string; never shown, never logged
    role          TEXT NOT NULL CHECK (role IN ('owner', 'member')),
    disabled      BOOLEAN NOT NULL DEFAULT false,
    created_at    BIGINT NOT NULL
);
CREATE UNIQUE INDEX users_email ON users (lower(email));  -- case-insensitive, as NOCASE

CREATE TABLE grants (
    user_id    TEXT NOT NULL REFERENCES users (id),
    project_id TEXT NOT NULL REFERENCES projects (id),
    created_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, project_id)
);

CREATE TABLE sessions (
    id_hash    BYTEA PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES users (id),
    created_at BIGINT NOT NULL,
    seen_at    BIGINT NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);

CREATE TABLE login_failures (
    subject TEXT NOT NULL,
    at      BIGINT NOT NULL
);
CREATE INDEX login_failures_subject ON login_failures (subject, at);

CREATE TABLE payments (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    reference   TEXT NOT NULL,
    amount      BIGINT NOT NULL CHECK (amount > 0),
    ledger_id   BIGINT NOT NULL UNIQUE REFERENCES ledger (id),
    recorded_by TEXT,
    created_at  BIGINT NOT NULL,
    UNIQUE (project_id, reference)
);

CREATE TABLE payer_addresses (
    project_id TEXT NOT NULL REFERENCES projects (id),
    address    TEXT NOT NULL,
    PRIMARY KEY (project_id, address)
);

CREATE TABLE purchases (
    tx_hash     TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    sender      TEXT NOT NULL,
    token_units TEXT NOT NULL,      -- the transferred integer amount, in decimal
    amount      BIGINT NOT NULL CHECK (amount >= 0),
    ledger_id   BIGINT NOT NULL UNIQUE REFERENCES ledger (id),
    created_at  BIGINT NOT NULL
);

ALTER TABLE api_keys ADD COLUMN name TEXT;

CREATE INDEX receipts_project_time ON receipts (project_id, created_at);
CREATE INDEX receipts_key_time ON receipts (key_id, created_at);
CREATE INDEX ledger_project_id ON ledger (project_id, id);

-- The transparency log as C2SP tiles. log_leaves keeps the leaves logged before tiles.
CREATE TABLE log_entries (
    leaf_index BIGINT PRIMARY KEY,
    receipt_id TEXT NOT NULL UNIQUE REFERENCES receipts (id)
);

CREATE TABLE log_tiles (
    level  INTEGER NOT NULL CHECK (level BETWEEN 0 AND 63),
    idx    BIGINT NOT NULL CHECK (idx >= 0),
    hashes BYTEA NOT NULL
        CHECK (length(hashes) % 32 = 0 AND length(hashes) BETWEEN 32 AND 8192),
    PRIMARY KEY (level, idx)
);

CREATE TRIGGER log_entries_are_append_only BEFORE UPDATE OR DELETE ON log_entries
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();
CREATE TRIGGER log_tiles_are_never_deleted BEFORE DELETE ON log_tiles
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();

-- A tile only grows: what it held stays its prefix (rewriting the same bytes is allowed).
CREATE FUNCTION log_tile_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.level <> OLD.level OR NEW.idx <> OLD.idx
       OR length(NEW.hashes) < length(OLD.hashes)
       OR substring(NEW.hashes FROM 1 FOR length(OLD.hashes)) <> OLD.hashes THEN
        RAISE EXCEPTION 'the log is append-only' USING ERRCODE = 'GWC01';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER log_tiles_only_grow BEFORE UPDATE ON log_tiles
FOR EACH ROW EXECUTE FUNCTION log_tile_grows();

-- A receipt logged with tiles leaves the queue of unlogged receipts too.
CREATE TRIGGER entry_leaves_queue AFTER INSERT ON log_entries
FOR EACH ROW EXECUTE FUNCTION leaf_leaves_queue();
