-- PostgreSQL schema, version 1: projects and API keys. Lists are text arrays, kept sorted
-- by the backend; times are unix seconds.

CREATE TABLE projects (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'archived')),
    monthly_budget BIGINT CHECK (monthly_budget >= 0),
    rpm            INTEGER CHECK (rpm > 0),
    allow_models   TEXT[],                      -- NULL: every model
    exclude_models TEXT[] NOT NULL DEFAULT '{}',
    created_at     BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    prefix        TEXT NOT NULL UNIQUE,
    key_hash      BYTEA NOT NULL,   -- HMAC-SHA256(pepper, key); the pepper is not in this database
    project_id    TEXT NOT NULL REFERENCES projects (id),
    scopes        TEXT[] NOT NULL,
    models        TEXT[],           -- NULL: every model the project allows
    monthly_limit BIGINT CHECK (monthly_limit >= 0),
    expires_at    BIGINT,
    rpm           INTEGER CHECK (rpm > 0),
    state         TEXT NOT NULL DEFAULT 'usable' CHECK (state IN ('usable', 'revoked')),
    created_at    BIGINT NOT NULL
);
CREATE INDEX api_keys_project ON api_keys (project_id);

-- Every process caches keys and projects until its admin epoch moves; the epoch moves
-- when a notification arrives on this channel. The triggers notify for any writer (the
-- CLI, the console, an operator's psql), at commit. Money columns added later are left
-- out of the column lists on purpose: a reservation must not empty every key cache.
-- A new policy column must be added to these lists.
CREATE FUNCTION gateway_admin_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gateway_admin', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER projects_notify
AFTER INSERT OR DELETE OR UPDATE OF id, name, state, monthly_budget, rpm, allow_models, exclude_models
ON projects FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();

CREATE TRIGGER api_keys_notify
AFTER INSERT OR DELETE OR UPDATE OF id, prefix, key_hash, project_id, scopes, models, monthly_limit,
    expires_at, rpm, state
ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();
