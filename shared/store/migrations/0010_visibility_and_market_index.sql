-- Schema 10: listings cost O(what the caller may see).
--
-- `audit_visibility` says who sees each event: one row per org that sees all of it
-- (`full_view` 1) or only its own terminated VMs (0). An org's listing and feed walk its rows
-- from the cursor instead of filtering the whole trail. Each write adds its event's rows
-- (`writes.audience`); the rows of the events written before are built when the schema is
-- brought to this version (see schema.rs), after their audience is derived again.
--
-- `on_market` marks the released units of live reservations, and the spot market walks only
-- those: a cancel or a reclaim takes units off it, and `market_ends_at` (the end of the
-- release or of the reservation's term, whichever is first) lets every write sweep off the
-- ones whose time ran out. `released` keeps what the reservation's record shows.

CREATE TABLE audit_visibility (
    org_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    full_view INTEGER NOT NULL CHECK (full_view IN (0, 1)),
    PRIMARY KEY (org_id, seq)
) WITHOUT ROWID;

ALTER TABLE reservation_units ADD COLUMN on_market INTEGER NOT NULL DEFAULT 0;

ALTER TABLE reservation_units ADD COLUMN market_ends_at INTEGER;

UPDATE reservation_units SET
    on_market = CASE WHEN released = 1 AND (SELECT state FROM reservations r
        WHERE r.id = reservation_units.reservation_id) = 'live' THEN 1 ELSE 0 END,
    market_ends_at = (SELECT CASE
            WHEN reservation_units.released_until IS NULL THEN r.ends_at
            WHEN r.ends_at IS NULL THEN reservation_units.released_until
            ELSE MIN(reservation_units.released_until, r.ends_at) END
        FROM reservations r WHERE r.id = reservation_units.reservation_id);

DROP INDEX reservation_units_released;

CREATE INDEX reservation_units_on_market ON reservation_units(node_id, unit_id) WHERE on_market = 1;

CREATE INDEX reservation_units_market_ends ON reservation_units(market_ends_at) WHERE on_market = 1;
