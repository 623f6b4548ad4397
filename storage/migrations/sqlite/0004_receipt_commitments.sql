-- Public receipt v2: salted commitments to the bodies instead of their plain SHA-256, and
-- who counted the usage. Receipts issued before this migration keep NULL salts and
-- commitments: their leaves are version 1 and never change.
ALTER TABLE receipts ADD COLUMN request_salt TEXT;         -- 16 bytes, hex; the project's only
ALTER TABLE receipts ADD COLUMN response_salt TEXT;
ALTER TABLE receipts ADD COLUMN request_commitment TEXT;   -- SHA-256(salt || body), hex
ALTER TABLE receipts ADD COLUMN response_commitment TEXT;  -- SHA-256(salt || SHA-256(body)), hex
ALTER TABLE receipts ADD COLUMN usage_source TEXT NOT NULL DEFAULT 'provider'
    CHECK (usage_source IN ('provider', 'gateway'));
