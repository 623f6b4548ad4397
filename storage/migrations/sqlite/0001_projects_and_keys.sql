CREATE TABLE projects (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'archived')),
    monthly_budget INTEGER CHECK (monthly_budget >= 0),
    rpm            INTEGER CHECK (rpm > 0),
    allow_models   TEXT,            -- JSON list, NULL: every model
    exclude_models TEXT NOT NULL DEFAULT '[]',
    created_at     INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    prefix        TEXT NOT NULL UNIQUE,
    key_hash      BLOB NOT NULL,    -- HMAC-SHA256(pepper, key); the pepper is not in this database
    project_id    TEXT NOT NULL REFERENCES projects (id),
    scopes        TEXT NOT NULL,    -- JSON list
    models        TEXT,             -- JSON list, NULL: every model the project allows
    monthly_limit INTEGER CHECK (monthly_limit >= 0),
    expires_at    INTEGER,
    rpm           INTEGER CHECK (rpm > 0),
    state         TEXT NOT NULL DEFAULT 'usable' CHECK (state IN ('usable', 'revoked')),
    created_at    INTEGER NOT NULL
);
CREATE INDEX api_keys_project ON api_keys (project_id);
