-- The console: its users, what they may see, their sessions, the throttle of failed
-- sign-ins, and payments an owner records. Times are unix seconds.

CREATE TABLE users (
    id            TEXT PRIMARY KEY,
    email         TEXT NOT NULL UNIQUE COLLATE NOCASE,
    password_hash TEXT NOT NULL,    -- argon2id, PHC string; never shown, never logged
    role          TEXT NOT NULL CHECK (role IN ('owner', 'member')),
    disabled      INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1)),
    created_at    INTEGER NOT NULL
);

-- A member sees only the projects granted to them; an owner sees every project.
CREATE TABLE grants (
    user_id    TEXT NOT NULL REFERENCES users (id),
    project_id TEXT NOT NULL REFERENCES projects (id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, project_id)
);

-- Server-side sessions: the cookie holds a random id, the table only its SHA-256.
CREATE TABLE sessions (
    id_hash    BLOB PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES users (id),
    created_at INTEGER NOT NULL,
    seen_at    INTEGER NOT NULL     -- idle expiry counts from here
);
CREATE INDEX sessions_user ON sessions (user_id);

-- One row per failed sign-in, under 'email:<address>' and 'addr:<client address>'.
CREATE TABLE login_failures (
    subject TEXT NOT NULL,
    at      INTEGER NOT NULL
);
CREATE INDEX login_failures_subject ON login_failures (subject, at);

-- Money that arrived by other means (invoice, transfer). Its ledger row is a credit; the
-- console shows it as kind 'payment'. A reference is credited once per project.
CREATE TABLE payments (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id),
    reference   TEXT NOT NULL,
    amount      INTEGER NOT NULL CHECK (amount > 0),
    ledger_id   INTEGER NOT NULL UNIQUE REFERENCES ledger (id),
    recorded_by TEXT,               -- the console user's email, or NULL from the CLI
    created_at  INTEGER NOT NULL,
    UNIQUE (project_id, reference)
);

-- Onchain purchases: the addresses a project pays from, and each transaction credited once
-- (across all projects). Its ledger row is a credit, shown as kind 'purchase'.
CREATE TABLE payer_addresses (
    project_id TEXT NOT NULL REFERENCES projects (id),
    address    TEXT NOT NULL,       -- 0x + 40 lowercase hex
    PRIMARY KEY (project_id, address)
);

CREATE TABLE purchases (
    tx_hash     TEXT PRIMARY KEY,   -- 0x + 64 lowercase hex
    project_id  TEXT NOT NULL REFERENCES projects (id),
    sender      TEXT NOT NULL,
    token_units TEXT NOT NULL,      -- the transferred integer amount, in decimal
    amount      INTEGER NOT NULL CHECK (amount >= 0),
    ledger_id   INTEGER NOT NULL UNIQUE REFERENCES ledger (id),
    created_at  INTEGER NOT NULL
);

-- An optional label of a key, set in the console.
ALTER TABLE api_keys ADD COLUMN name TEXT;

CREATE INDEX receipts_project_time ON receipts (project_id, created_at);
CREATE INDEX receipts_key_time ON receipts (key_id, created_at);  -- a key's last use
