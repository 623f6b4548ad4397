-- The audit log (decisions.md, Operators (wave 3)): every administrative change and
-- sign-in, written in the transaction of its change. Append-only: a trigger refuses every
-- UPDATE, DELETE and TRUNCATE, whoever sends it (SQLSTATE GWC01: a change the rules
-- forbid). `seq` orders it (newest first) and is its lists' cursor.
CREATE TABLE audit_log (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    at         BIGINT NOT NULL,
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     JSONB NOT NULL,
    changes    JSONB NOT NULL,
    request_id TEXT
);
CREATE INDEX audit_log_action ON audit_log (action, seq);
CREATE INDEX audit_log_actor ON audit_log (actor, seq);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'GWC01';
END;
$$;

CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
