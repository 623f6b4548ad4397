-- Tokens per minute (input + output) on projects and keys, beside rpm; NULL: no token
-- limit. A limit is policy that keys' caches carry: a change of it notifies, like rpm's
-- (the triggers of 0007, recreated with the new column).
ALTER TABLE projects ADD COLUMN tpm INTEGER CHECK (tpm > 0);
ALTER TABLE api_keys ADD COLUMN tpm INTEGER CHECK (tpm > 0);

DROP TRIGGER projects_notify ON projects;
DROP TRIGGER api_keys_notify ON api_keys;

CREATE TRIGGER projects_notify
AFTER DELETE OR UPDATE OF id, name, state, monthly_budget, rpm, tpm, allow_models,
    exclude_models
ON projects FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();

CREATE TRIGGER api_keys_notify
AFTER DELETE OR UPDATE OF id, prefix, key_hash, project_id, scopes, models, monthly_limit,
    expires_at, rpm, tpm, state
ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();
