CREATE TABLE sandboxes (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    runtime    TEXT NOT NULL CHECK (runtime IN ('python', 'node', 'bash')),
    timeout_s  INTEGER NOT NULL CHECK (timeout_s > 0),
    memory_mb  INTEGER NOT NULL CHECK (memory_mb > 0),
    created_at INTEGER NOT NULL
);

-- The transparency log: receipts in issue order, appended in batches, never rewritten.
CREATE TABLE log_leaves (
    leaf_index INTEGER PRIMARY KEY,  -- 0-based position in the Merkle tree
    receipt_id TEXT NOT NULL UNIQUE REFERENCES receipts (id),
    public_receipt BLOB NOT NULL,    -- canonical bytes of the receipt's public fields
    signature  TEXT NOT NULL         -- hex Ed25519 signature over the public receipt
);

CREATE TABLE tree_heads (
    size      INTEGER PRIMARY KEY,
    root_hash TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    signature TEXT NOT NULL
);

CREATE TRIGGER log_is_append_only BEFORE UPDATE ON log_leaves
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_leaves_are_never_deleted BEFORE DELETE ON log_leaves
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
