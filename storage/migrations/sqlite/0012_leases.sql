-- Leases: a slice of a project's money held by one serving process, so that its requests
-- reserve in memory and only their settlement is written (gateway/leased_meter.py).
-- A lease is a row of `reservations` (lease = 1) owned by the process: it is admitted by
-- the same trigger as any hold (the key's monthly limit, the project's budget and the
-- available balance, in one statement), counted in `reserved` like any hold, renewed
-- with the owner's holds and released by the same sweeper when its owner dies.
--   projects.leased = sum of the project's open leases (api_keys.leased: the key's);
--   what requests hold directly is reserved - leased.
-- A lease only shrinks: a receipt charged against it takes its cost out of it, and its
-- owner gives back what it does not need. `recalled` is another process asking for it.

ALTER TABLE reservations ADD COLUMN lease INTEGER NOT NULL DEFAULT 0 CHECK (lease IN (0, 1));
ALTER TABLE reservations ADD COLUMN recalled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN leased INTEGER NOT NULL DEFAULT 0 CHECK (leased >= 0);
ALTER TABLE api_keys ADD COLUMN leased INTEGER NOT NULL DEFAULT 0 CHECK (leased >= 0);
CREATE INDEX reservations_leases ON reservations (project_id) WHERE lease = 1;

CREATE TRIGGER lease_counts AFTER INSERT ON reservations WHEN NEW.lease = 1
BEGIN
    UPDATE projects SET leased = leased + NEW.amount WHERE id = NEW.project_id;
    UPDATE api_keys SET leased = leased + NEW.amount WHERE id = NEW.key_id;
END;

CREATE TRIGGER lease_ends AFTER DELETE ON reservations WHEN OLD.lease = 1
BEGIN
    UPDATE projects SET leased = leased - OLD.amount WHERE id = OLD.project_id;
    UPDATE api_keys SET leased = leased - OLD.amount WHERE id = OLD.key_id;
END;

-- A hold is fixed at admission; a lease may only shrink.
CREATE TRIGGER lease_only_shrinks BEFORE UPDATE OF amount, lease ON reservations
BEGIN
    SELECT RAISE(ABORT, 'hold_is_fixed')
    WHERE OLD.lease = 0 OR NEW.lease <> OLD.lease OR NEW.amount > OLD.amount;
END;

CREATE TRIGGER lease_shrinks AFTER UPDATE OF amount ON reservations
BEGIN
    UPDATE projects
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.project_id;
    UPDATE api_keys
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.key_id;
END;

-- Settlement (0011's receipt_charges on receipt_rows, ids compared in their text form):
-- a hold is consumed once as before; against a lease, the receipt takes its cost out of
-- the lease (receipt_needs_hold of 0011 has checked that the lease covers it). The
-- balance, the month's spend, the ledger row and the key's last use move as in 0011.
DROP TRIGGER receipt_charges;
CREATE TRIGGER receipt_charges AFTER INSERT ON receipt_rows
BEGIN
    DELETE FROM reservations WHERE id = (CASE typeof(NEW.reservation_id) WHEN 'blob'
        THEN 'rsv_' || lower(hex(NEW.reservation_id)) ELSE NEW.reservation_id END)
        AND lease = 0;
    UPDATE reservations SET amount = amount - NEW.cost
    WHERE id = (CASE typeof(NEW.reservation_id) WHEN 'blob'
        THEN 'rsv_' || lower(hex(NEW.reservation_id)) ELSE NEW.reservation_id END)
        AND lease = 1;
    UPDATE projects SET balance = balance - NEW.cost
    WHERE id = (CASE typeof(NEW.project_id) WHEN 'blob'
                THEN 'prj_' || lower(hex(NEW.project_id)) ELSE NEW.project_id END);
    INSERT INTO month_spend (subject, month, spent)
    SELECT CASE typeof(NEW.project_id) WHEN 'blob'
               THEN 'prj_' || lower(hex(NEW.project_id)) ELSE NEW.project_id END,
           coalesce(NEW.month, strftime('%Y-%m', NEW.created_at / 1000000, 'unixepoch')),
           NEW.cost
    WHERE true
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
    INSERT INTO month_spend (subject, month, spent)
    SELECT CASE typeof(NEW.key_id) WHEN 'blob'
               THEN 'key_' || lower(hex(NEW.key_id)) ELSE NEW.key_id END,
           coalesce(NEW.month, strftime('%Y-%m', NEW.created_at / 1000000, 'unixepoch')),
           NEW.cost
    WHERE NEW.key_id IS NOT NULL
    ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent;
    INSERT INTO ledger (kind, receipt) VALUES ('charge', NEW.seq);
    UPDATE api_keys SET last_used_us = max(coalesce(last_used_us, 0), NEW.created_at)
    WHERE id = (CASE typeof(NEW.key_id) WHEN 'blob'
                THEN 'key_' || lower(hex(NEW.key_id)) ELSE NEW.key_id END);
END;
