-- A payer address belongs to at most one project of the deployment (decisions.md, Hardening
-- III): a transfer from it is credited to that project alone. It was unique per project
-- only, so a project could register another's address and claim its transfers.
--
-- Existing duplicates: the project that registered the address first keeps it, every
-- other loses it, and each removal is noted (migration_notes, which the migrator logs).
-- "First" is the earliest registration still stored: the row written by the oldest
-- transaction (age(xmin), counted back from now, so xid wraparound does not reorder it),
-- then the older project. A project's PATCH re-inserted its whole list, so a project that
-- saved its list again after another registered the address counts from that save
-- (nothing older is stored). The note lets the operator give the address back.
CREATE TEMPORARY TABLE payer_address_holders ON COMMIT DROP AS
SELECT a.project_id, a.address,
       row_number() OVER (PARTITION BY a.address
                          ORDER BY age(a.xmin) DESC, p.created_at, a.project_id) AS rank
FROM payer_addresses a JOIN projects p ON p.id = a.project_id;

INSERT INTO migration_notes (version, note)
SELECT 16, 'payer address ' || lost.address || ' removed from project ' || lost.project_id
           || ' (project ' || kept.project_id || ' registered it first)'
FROM payer_address_holders lost
JOIN payer_address_holders kept ON kept.address = lost.address AND kept.rank = 1
WHERE lost.rank > 1
ORDER BY lost.address, lost.rank;

DELETE FROM payer_addresses a
USING payer_address_holders lost
WHERE lost.rank > 1 AND a.project_id = lost.project_id AND a.address = lost.address;

ALTER TABLE payer_addresses
    ADD CONSTRAINT payer_addresses_one_project UNIQUE (address);
