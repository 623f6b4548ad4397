-- Leases: a slice of a project's money held by one serving process, so that its requests
-- reserve in memory and only their settlement is written (gateway/leased_meter.py).
-- A lease is a row of `reservations` (lease = true) owned by the process: it is admitted
-- by the same trigger as any hold (under the project's and the key's row locks), counted
-- in `reserved` like any hold, renewed with the owner's holds and released by the same
-- sweeper when its owner dies.
--   projects.leased = sum of the project's open leases (api_keys.leased: the key's);
--   what requests hold directly is reserved - leased.
-- A lease only shrinks: a receipt charged against it takes its cost out of it, and its
-- owner gives back what it does not need. `recalled` is another process asking for it.
-- Lock order as everywhere: the reservation row, then the project row, then the key row.

ALTER TABLE reservations ADD COLUMN lease BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE reservations ADD COLUMN recalled BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE projects ADD COLUMN leased BIGINT NOT NULL DEFAULT 0 CHECK (leased >= 0);
ALTER TABLE api_keys ADD COLUMN leased BIGINT NOT NULL DEFAULT 0 CHECK (leased >= 0);
CREATE INDEX reservations_leases ON reservations (project_id) WHERE lease;

CREATE FUNCTION lease_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE projects SET leased = leased + NEW.amount WHERE id = NEW.project_id;
    UPDATE api_keys SET leased = leased + NEW.amount WHERE id = NEW.key_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER lease_counts AFTER INSERT ON reservations
FOR EACH ROW WHEN (NEW.lease) EXECUTE FUNCTION lease_counts();

CREATE FUNCTION lease_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE projects SET leased = leased - OLD.amount WHERE id = OLD.project_id;
    UPDATE api_keys SET leased = leased - OLD.amount WHERE id = OLD.key_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER lease_ends AFTER DELETE ON reservations
FOR EACH ROW WHEN (OLD.lease) EXECUTE FUNCTION lease_ends();

CREATE FUNCTION lease_shrinks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE projects
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.project_id;
    UPDATE api_keys
    SET reserved = reserved + NEW.amount - OLD.amount, leased = leased + NEW.amount - OLD.amount
    WHERE id = NEW.key_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER lease_shrinks AFTER UPDATE OF amount ON reservations
FOR EACH ROW WHEN (NEW.amount <> OLD.amount) EXECUTE FUNCTION lease_shrinks();

-- A hold is fixed at admission; a lease may only shrink.
DROP TRIGGER reservation_is_fixed ON reservations;
CREATE TRIGGER reservation_is_fixed
BEFORE UPDATE OF id, project_id, key_id, amount, month, lease ON reservations
FOR EACH ROW WHEN (
    NEW.id <> OLD.id OR NEW.project_id <> OLD.project_id
    OR NEW.key_id IS DISTINCT FROM OLD.key_id OR NEW.month <> OLD.month
    OR NEW.lease <> OLD.lease
    OR (NEW.amount <> OLD.amount AND NOT (OLD.lease AND NEW.amount < OLD.amount))
) EXECUTE FUNCTION gateway_forbidden();

-- Settlement, as before for a hold (consumed once); against a lease, the receipt takes its
-- cost out of the lease. Either row is locked by the statement before it is changed.
CREATE OR REPLACE FUNCTION receipt_consumes_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reservations r
    WHERE r.id = NEW.reservation_id AND r.project_id = NEW.project_id AND r.amount >= NEW.cost
      AND NOT r.lease;
    IF NOT FOUND THEN
        UPDATE reservations r SET amount = r.amount - NEW.cost
        WHERE r.id = NEW.reservation_id AND r.project_id = NEW.project_id
          AND r.amount >= NEW.cost AND r.lease;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'reservation_gone' USING ERRCODE = 'GWR01';
        END IF;
    END IF;
    INSERT INTO ledger (project_id, key_id, kind, amount, month, receipt_id, created_at)
    VALUES (NEW.project_id, NEW.key_id, 'charge', NEW.cost, NEW.month, NEW.id,
            NEW.created_at / 1000000);
    RETURN NEW;
END
$$;
