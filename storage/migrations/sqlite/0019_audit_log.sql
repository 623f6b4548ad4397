-- The audit log (decisions.md, Operators (wave 3)): every administrative change and
-- sign-in, written in the transaction of its change. Append-only: no path updates or
-- deletes an entry, and these triggers refuse anyone who tries (the CLI's sqlite3 too).
-- `seq` orders it (newest first) and is its lists' cursor.
CREATE TABLE audit_log (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    at         INTEGER NOT NULL,
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,   -- JSON object
    changes    TEXT NOT NULL,   -- JSON object
    request_id TEXT
);
CREATE INDEX audit_log_action ON audit_log (action, seq);
CREATE INDEX audit_log_actor ON audit_log (actor, seq);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;

CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;
