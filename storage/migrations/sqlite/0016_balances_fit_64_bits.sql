-- A credit that would take a project's balance past 2^63-1 micro-units is refused with
-- nothing written (AmountOverflow): SQLite would otherwise store the sum as a REAL, an
-- inexact balance that later small amounts no longer move. (PostgreSQL refuses such a
-- sum by itself: bigint out of range.) Charges need no check: they only lower a balance.
CREATE TRIGGER ledger_credit_fits BEFORE INSERT ON ledger
WHEN NEW.kind = 'credit'
BEGIN
    SELECT RAISE(ABORT, 'amount_overflow')
    FROM projects
    WHERE id = NEW.project_id AND balance > 9223372036854775807 - NEW.amount;
END;
