-- Schema 18: every write appends an event, and each index of `audit_events` is one more
-- page a write changes, syncs and ships to every replica. Indexes no query needs go:
-- * `audit_by_action` and `audit_by_time` served only an operator's listing filtered by
--   action or time alone; operators see every event, so that listing walks the trail in
--   order (orgs' listings walk `audit_visibility`, which they never used);
-- * `audit_unsealed`: a chain's unsealed events are always its newest ones (later writes
--   seal them oldest first), so a write's read finds them walking `audit_by_chain` back from
--   the chain's end;
-- * `vms_by_org` and `vms_by_node`: the VM listing walks `vms_by_org_and_id` and the VMs by id.
-- No row changes.
DROP INDEX IF EXISTS audit_by_action;
DROP INDEX IF EXISTS audit_by_time;
DROP INDEX IF EXISTS audit_unsealed;
DROP INDEX IF EXISTS vms_by_org;
DROP INDEX IF EXISTS vms_by_node;
-- The node and reservation filters' indexes keep only the events that have a node or a
-- reservation: the platform's events (orgs, keys) add nothing to them.
DROP INDEX IF EXISTS audit_by_node;
CREATE INDEX audit_by_node ON audit_events(node_id, seq) WHERE node_id IS NOT NULL;
DROP INDEX IF EXISTS audit_by_reservation;
CREATE INDEX audit_by_reservation ON audit_events(reservation_id, seq) WHERE reservation_id IS NOT NULL;
