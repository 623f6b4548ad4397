-- A payer address belongs to at most one project of the deployment (decisions.md, Hardening
-- III): a transfer from it is credited to that project alone. It was unique per project
-- only, so a project could register another's address and claim its transfers.
--
-- Existing duplicates: the project that registered the address first keeps it, every
-- other loses it, and each removal is noted (migration_notes, which the migrator logs).
-- "First" is the earliest registration still stored, the smallest rowid: a project's
-- PATCH re-inserted its whole list, so a project that saved its list again after another
-- registered the address counts from that save (nothing older is stored). The note lets
-- the operator give the address back.
INSERT INTO migration_notes (version, note)
SELECT 15, 'payer address ' || lost.address || ' removed from project ' || lost.project_id
           || ' (project ' || kept.project_id || ' registered it first)'
FROM payer_addresses lost
JOIN payer_addresses kept
  ON kept.rowid = (SELECT min(rowid) FROM payer_addresses WHERE address = lost.address)
WHERE lost.rowid <> kept.rowid
ORDER BY lost.address, lost.rowid;

DELETE FROM payer_addresses
WHERE rowid <> (SELECT min(rowid) FROM payer_addresses a WHERE a.address = payer_addresses.address);

CREATE UNIQUE INDEX payer_addresses_one_project ON payer_addresses (address);
