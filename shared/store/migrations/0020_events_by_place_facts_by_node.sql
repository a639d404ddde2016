-- Schema 20: fewer pages per write. Each index of `audit_events` is one more page every
-- write changes, syncs and ships to every replica; three of them go. A node's facts are
-- named after the node, so that the versions one write moves share a page.
-- * The event's id needs no index of its own: a write finds its event by its place in its
--   chain, and nothing looks an event up by id alone. Its uniqueness was the id's index,
--   a table constraint, so the table is built again without it (every row kept as it is).
-- * `audit_by_node` and `audit_by_reservation`: every event about a node, its reservations
--   and its VMs is in the node's chain, so an operator's listing of a node's or a
--   reservation's events walks that chain (`audit_by_place`). Only the events written
--   before each node had its chain (chain `trail`) keep an index by node.
-- The write statement names `audit_by_place`, so a write against an older schema fails and
-- brings this one (a plan read there named its facts as here: their versions are checked
-- after this migration, by the write that brought it).
DROP VIEW IF EXISTS writes;
CREATE TABLE audit_events_rebuilt (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    at INTEGER NOT NULL,
    actor_key_id TEXT NOT NULL,
    actor_org_id TEXT,
    action TEXT NOT NULL,
    node_id TEXT,
    reservation_id TEXT,
    vm_id TEXT,
    org_id TEXT,
    subject_id TEXT,
    unit_ids TEXT NOT NULL,
    terminated TEXT NOT NULL,
    skipped TEXT NOT NULL,
    reason TEXT,
    request_id TEXT NOT NULL,
    visible_to TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    client_request_id TEXT,
    vm_owners TEXT NOT NULL DEFAULT '[]',
    hash_version INTEGER NOT NULL DEFAULT 1,
    deadlines TEXT NOT NULL DEFAULT '{}',
    release_until INTEGER,
    chain TEXT NOT NULL DEFAULT 'trail',
    chain_seq INTEGER,
    after_seq INTEGER,
    seal TEXT
);
INSERT INTO audit_events_rebuilt (seq, id, at, actor_key_id, actor_org_id, action, node_id,
        reservation_id, vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason,
        request_id, visible_to, prev_hash, hash, client_request_id, vm_owners, hash_version,
        deadlines, release_until, chain, chain_seq, after_seq, seal)
    SELECT seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, vm_id,
        org_id, subject_id, unit_ids, terminated, skipped, reason, request_id, visible_to,
        prev_hash, hash, client_request_id, vm_owners, hash_version, deadlines, release_until,
        chain, chain_seq, after_seq, seal
    FROM audit_events ORDER BY seq;
DROP TABLE audit_events;
ALTER TABLE audit_events_rebuilt RENAME TO audit_events;
CREATE UNIQUE INDEX audit_by_place ON audit_events(chain, chain_seq);
CREATE INDEX audit_trail_by_node ON audit_events(node_id, seq)
    WHERE chain = 'trail' AND node_id IS NOT NULL;
-- A node's units, reservations and VMs are named after it: ['node', node, kind, id]
-- (src/facts.rs). A fact whose reservation or VM is gone keeps no version: it is read as 0,
-- as a fact never written.
UPDATE fact_versions SET fact = json_array('node', fact ->> 1, 'unit', fact ->> 2)
    WHERE fact ->> 0 = 'unit';
DELETE FROM fact_versions WHERE fact ->> 0 = 'reservation'
    AND NOT EXISTS (SELECT 1 FROM reservations WHERE id = fact_versions.fact ->> 1);
UPDATE fact_versions SET fact = json_array('node',
        (SELECT node_id FROM reservations WHERE id = fact_versions.fact ->> 1),
        'reservation', fact ->> 1)
    WHERE fact ->> 0 = 'reservation';
DELETE FROM fact_versions WHERE fact ->> 0 = 'vm'
    AND NOT EXISTS (SELECT 1 FROM vms WHERE id = fact_versions.fact ->> 1);
UPDATE fact_versions SET fact = json_array('node',
        (SELECT node_id FROM vms WHERE id = fact_versions.fact ->> 1), 'vm', fact ->> 1)
    WHERE fact ->> 0 = 'vm';
-- The sweep of the market's index (every write: units whose time ran out) reads only units
-- with an end: an open-ended release, of an open-ended reservation, adds nothing to its index.
DROP INDEX IF EXISTS reservation_units_market_ends;
CREATE INDEX reservation_units_market_ends ON reservation_units(market_ends_at)
    WHERE on_market = 1 AND market_ends_at IS NOT NULL;
