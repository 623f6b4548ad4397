CREATE TABLE sandboxes (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    runtime    TEXT NOT NULL CHECK (runtime IN ('python', 'node', 'bash')),
    timeout_s  INTEGER NOT NULL CHECK (timeout_s > 0),
    memory_mb  INTEGER NOT NULL CHECK (memory_mb > 0),
    created_at BIGINT NOT NULL
);

-- The transparency log: receipts in issue order, appended in batches, never rewritten.
CREATE TABLE log_leaves (
    leaf_index     BIGINT PRIMARY KEY,  -- 0-based position in the Merkle tree
    receipt_id     TEXT NOT NULL UNIQUE REFERENCES receipts (id),
    public_receipt BYTEA NOT NULL,      -- canonical bytes of the receipt's public fields
    signature      TEXT NOT NULL        -- hex Ed25519 signature over the public receipt
);

CREATE TABLE tree_heads (
    size      BIGINT PRIMARY KEY,
    root_hash TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    signature TEXT NOT NULL
);

CREATE TRIGGER log_is_append_only BEFORE UPDATE OR DELETE ON log_leaves
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();
CREATE TRIGGER tree_heads_are_append_only BEFORE UPDATE OR DELETE ON tree_heads
FOR EACH ROW EXECUTE FUNCTION gateway_forbidden();

-- Receipts not yet in the log. With concurrent writers, issue order (receipts.seq) is not
-- commit order: a receipt may commit after a later one was logged, so "after the last
-- logged receipt" would skip it forever. This queue holds exactly the unlogged ones.
CREATE TABLE log_pending (
    seq        BIGINT PRIMARY KEY,
    receipt_id TEXT NOT NULL UNIQUE REFERENCES receipts (id)
);

CREATE FUNCTION receipt_awaits_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO log_pending (seq, receipt_id) VALUES (NEW.seq, NEW.id);
    RETURN NULL;
END
$$;

-- AFTER: the queue's foreign key needs the receipt row in place.
CREATE TRIGGER receipt_awaits_log AFTER INSERT ON receipts
FOR EACH ROW EXECUTE FUNCTION receipt_awaits_log();

CREATE FUNCTION leaf_leaves_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM log_pending WHERE receipt_id = NEW.receipt_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER leaf_leaves_queue AFTER INSERT ON log_leaves
FOR EACH ROW EXECUTE FUNCTION leaf_leaves_queue();
