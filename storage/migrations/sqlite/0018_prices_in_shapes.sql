-- The prices a receipt was charged at (decisions.md, "Prices, exactly": receipts show the
-- price of each class that was applied) are stored once per receipt shape, not per row:
-- a model's prices repeat on every receipt of it, and as JSON on each row they took
-- 190 of a receipt's bytes (bench/storage_size.py: 559 bytes a request against a goal of
-- 400). A shape is now its labels and its prices (NULL: none, as for a sandbox run); the
-- view `receipts` shows them within the usage again, as the gateway settled it.
ALTER TABLE receipt_shapes ADD COLUMN prices TEXT;

DROP INDEX receipt_shapes_unique;
CREATE UNIQUE INDEX receipt_shapes_unique ON receipt_shapes
    (kind, endpoint, model_or_runtime, status, usage_source, coalesce(provider, x''),
     coalesce(prices, x''));

DROP VIEW receipts;
CREATE VIEW receipts AS
SELECT r.seq AS seq,
    CASE typeof(r.id) WHEN 'blob' THEN 'rcpt_' || lower(hex(r.id)) ELSE r.id END AS id,
    CASE typeof(r.reservation_id) WHEN 'blob'
        THEN 'rsv_' || lower(hex(r.reservation_id)) ELSE r.reservation_id END AS reservation_id,
    CASE typeof(r.project_id) WHEN 'blob'
        THEN 'prj_' || lower(hex(r.project_id)) ELSE r.project_id END AS project_id,
    CASE typeof(r.key_id) WHEN 'blob'
        THEN 'key_' || lower(hex(r.key_id)) ELSE r.key_id END AS key_id,
    CASE typeof(r.request_id) WHEN 'blob'
        THEN 'req_' || lower(hex(r.request_id)) ELSE r.request_id END AS request_id,
    s.kind, s.endpoint, s.model_or_runtime, s.status,
    json_patch(json_patch(json_patch(coalesce(r.usage_rest, '{}'), coalesce(s.prices, '{}')),
        CASE WHEN r.input_tokens IS NULL THEN '{}'
             ELSE json_object('input_tokens', r.input_tokens) END),
        CASE WHEN r.output_tokens IS NULL THEN '{}'
             ELSE json_object('output_tokens', r.output_tokens) END) AS usage,
    r.cost,
    coalesce(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')) AS month,
    r.created_at,
    CASE typeof(r.request_sha256) WHEN 'blob'
        THEN lower(hex(r.request_sha256)) ELSE r.request_sha256 END AS request_sha256,
    CASE typeof(r.response_sha256) WHEN 'blob'
        THEN lower(hex(r.response_sha256)) ELSE r.response_sha256 END AS response_sha256,
    CASE typeof(r.request_salt) WHEN 'blob'
        THEN lower(hex(r.request_salt)) ELSE r.request_salt END AS request_salt,
    CASE typeof(r.response_salt) WHEN 'blob'
        THEN lower(hex(r.response_salt)) ELSE r.response_salt END AS response_salt,
    CASE typeof(r.request_commitment) WHEN 'blob'
        THEN lower(hex(r.request_commitment)) ELSE r.request_commitment END AS request_commitment,
    CASE typeof(r.response_commitment) WHEN 'blob'
        THEN lower(hex(r.response_commitment)) ELSE r.response_commitment END
        AS response_commitment,
    s.usage_source, s.provider
FROM receipt_rows r JOIN receipt_shapes s ON s.id = r.shape;

-- An UPDATE of the view's cost reaches the row (what an operator, or a tamper test, does).
CREATE TRIGGER receipts_update_cost INSTEAD OF UPDATE OF cost ON receipts
BEGIN
    UPDATE receipt_rows SET cost = NEW.cost WHERE seq = OLD.seq;
END;
