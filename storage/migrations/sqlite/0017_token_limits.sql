-- Tokens per minute (input + output) on projects and keys, beside rpm; NULL: no token
-- limit. A limit is policy that keys' caches carry: its change counts as an admin change,
-- like rpm's (the triggers of 0010, recreated with the new column).
ALTER TABLE projects ADD COLUMN tpm INTEGER CHECK (tpm > 0);
ALTER TABLE api_keys ADD COLUMN tpm INTEGER CHECK (tpm > 0);

DROP TRIGGER projects_admin_change;
CREATE TRIGGER projects_admin_change
AFTER UPDATE OF id, name, state, monthly_budget, rpm, tpm, allow_models, exclude_models
ON projects
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;

DROP TRIGGER api_keys_admin_change;
CREATE TRIGGER api_keys_admin_change
AFTER UPDATE OF id, prefix, key_hash, project_id, scopes, models, monthly_limit, expires_at,
    rpm, tpm, state ON api_keys
BEGIN
    UPDATE admin_changes SET n = n + 1;
END;
