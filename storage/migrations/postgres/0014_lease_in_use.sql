-- What the requests in flight hold of a lease (gateway/leased_meter.py): the owner writes
-- it with its housekeeping (every 50 ms while it changes), so that `reserved` shows the
-- requests' own holds whether they were taken from a lease or directly. Admission does not
-- read it: a lease is held whole, used or not.
ALTER TABLE reservations ADD COLUMN in_use BIGINT NOT NULL DEFAULT 0 CHECK (in_use >= 0);
