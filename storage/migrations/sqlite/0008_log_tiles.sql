-- The transparency log as C2SP tiles (gateway/proofs/tiles.py). New leaves store no copy of
-- the public receipt and no per-receipt signature: the receipt row rebuilds the public
-- receipt, its leaf hash is in a level-0 tile, and the signed tree head covers it.
-- log_leaves keeps the leaves logged before this migration, unchanged and still served.

-- Which receipt is at which leaf (leaves logged after this migration).
CREATE TABLE log_entries (
    leaf_index INTEGER PRIMARY KEY,
    receipt_id TEXT NOT NULL REFERENCES receipts (id)
);
CREATE UNIQUE INDEX log_entries_receipt ON log_entries (receipt_id);

-- Tiles of 32-byte hashes: 1 to 256 of them. A full tile never changes; the rightmost
-- tile of a level grows, and only by appending (what it published stays its prefix).
-- Rewriting a tile with the same bytes is allowed: re-running an interrupted conversion
-- of the leaves logged before tiles writes the same full tiles again.
CREATE TABLE log_tiles (
    level  INTEGER NOT NULL CHECK (level BETWEEN 0 AND 63),
    idx    INTEGER NOT NULL CHECK (idx >= 0),
    hashes BLOB NOT NULL CHECK (length(hashes) % 32 = 0 AND length(hashes) BETWEEN 32 AND 8192),
    PRIMARY KEY (level, idx)
) WITHOUT ROWID;

CREATE TRIGGER log_entries_are_append_only BEFORE UPDATE ON log_entries
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_entries_are_never_deleted BEFORE DELETE ON log_entries
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_tiles_only_grow BEFORE UPDATE ON log_tiles
WHEN NEW.level != OLD.level OR NEW.idx != OLD.idx
  OR length(NEW.hashes) < length(OLD.hashes)
  OR substr(NEW.hashes, 1, length(OLD.hashes)) != OLD.hashes
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
CREATE TRIGGER log_tiles_are_never_deleted BEFORE DELETE ON log_tiles
BEGIN
    SELECT RAISE(ABORT, 'the log is append-only');
END;
