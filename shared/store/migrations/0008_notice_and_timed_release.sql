-- Schema 8: notice for spot buyers. A reclaim may give the spot VMs on the units it
-- takes back a deadline instead of stopping them now, and a release may end by itself at
-- `until`. Nothing runs in the background: a VM row stays running with its deadline
-- (vms.terminates_at) and every read derives from the clock whether it still runs; a unit's
-- release carries its end (reservation_units.released_until) and every read derives from the
-- clock whether it is still released. Writes that touch them write the outcome down.

ALTER TABLE vms ADD COLUMN terminates_at INTEGER;

ALTER TABLE vms ADD COLUMN noticed_at INTEGER;

ALTER TABLE vms ADD COLUMN interruption_reason TEXT
    CHECK (interruption_reason IS NULL OR interruption_reason IN ('reclaimed', 'release-ends'));

ALTER TABLE vms ADD COLUMN interruption_reservation_id TEXT;

ALTER TABLE vms ADD COLUMN interruption_unit_ids TEXT;

ALTER TABLE reservation_units ADD COLUMN released_until INTEGER;

-- The event records the deadlines it gave ({vmId: ms}) and a release's end; both are hashed
-- (hash version 3).
ALTER TABLE audit_events ADD COLUMN deadlines TEXT NOT NULL DEFAULT '{}';

ALTER TABLE audit_events ADD COLUMN release_until INTEGER;
