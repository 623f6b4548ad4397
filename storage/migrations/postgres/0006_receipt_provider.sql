-- The provider that served a request: the model's own, or the fallback that did.
ALTER TABLE receipts ADD COLUMN provider TEXT;
