-- A new project or key empties no cache (unknown prefixes are never cached), so only
-- changes and deletions notify. An insert's notification used to arrive a moment after the
-- insert's commit and move the epoch under a reader that had already looked at it.
DROP TRIGGER projects_notify ON projects;
DROP TRIGGER api_keys_notify ON api_keys;

CREATE TRIGGER projects_notify
AFTER DELETE OR UPDATE OF id, name, state, monthly_budget, rpm, allow_models, exclude_models
ON projects FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();

CREATE TRIGGER api_keys_notify
AFTER DELETE OR UPDATE OF id, prefix, key_hash, project_id, scopes, models, monthly_limit,
    expires_at, rpm, state
ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION gateway_admin_changed();
