-- The instances serving from this database, each leased, and the admin change counter
-- they acknowledge (the same schema as PostgreSQL's 0009). One process serves a SQLite
-- file and sees every change at its next request (the epoch file), so nothing waits for
-- these acknowledgements here; the registry still leases the process and fences it.

CREATE TABLE admin_changes (
    one INTEGER PRIMARY KEY DEFAULT 1 CHECK (one = 1),
    n   INTEGER NOT NULL
);
INSERT INTO admin_changes (n) VALUES (0);

CREATE TABLE instances (
    id          TEXT PRIMARY KEY,
    started_at  INTEGER NOT NULL,   -- milliseconds
    lease_until INTEGER NOT NULL,   -- milliseconds
    acked       INTEGER NOT NULL DEFAULT 0
);

CREATE TRIGGER projects_admin_change
AFTER UPDATE OF id, name, state, monthly_budget, rpm, allow_models, exclude_models ON projects
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;

CREATE TRIGGER projects_admin_delete AFTER DELETE ON projects
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;

CREATE TRIGGER api_keys_admin_change
AFTER UPDATE OF id, prefix, key_hash, project_id, scopes, models, monthly_limit, expires_at,
    rpm, state ON api_keys
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;

CREATE TRIGGER api_keys_admin_delete AFTER DELETE ON api_keys
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;
