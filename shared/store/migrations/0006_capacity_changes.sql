-- Schema 6: a release or reclaim is one write: its audit event, inserted into the view
-- capacity_changes, also applies the change it records (the units' released flags, the spot
-- VMs it terminates with their units, the reservation's updated_at). A request then holds
-- the write lock for its one read and this one insert; a replica still on schema 5 fails on
-- the missing view instead of writing an event without its change.

CREATE VIEW capacity_changes AS
    SELECT seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, vm_id,
        org_id, subject_id, unit_ids, terminated, skipped, reason, request_id,
        client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash
    FROM audit_events
    WHERE action IN ('reservation.release', 'reservation.reclaim');

CREATE TRIGGER capacity_change_applies
    INSTEAD OF INSERT ON capacity_changes
BEGIN
    SELECT RAISE(ABORT, 'refused: not-a-capacity-change')
        WHERE NEW.action NOT IN ('reservation.release', 'reservation.reclaim');
    INSERT INTO audit_events (seq, id, at, actor_key_id, actor_org_id, action, node_id,
        reservation_id, vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason,
        request_id, client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash)
    VALUES (NEW.seq, NEW.id, NEW.at, NEW.actor_key_id, NEW.actor_org_id, NEW.action,
        NEW.node_id, NEW.reservation_id, NEW.vm_id, NEW.org_id, NEW.subject_id, NEW.unit_ids,
        NEW.terminated, NEW.skipped, NEW.reason, NEW.request_id, NEW.client_request_id,
        NEW.visible_to, NEW.vm_owners, NEW.hash_version, NEW.prev_hash, NEW.hash);
    UPDATE reservation_units SET released = (NEW.action = 'reservation.release')
        WHERE reservation_id = NEW.reservation_id
          AND released <> (NEW.action = 'reservation.release')
          AND unit_id IN (SELECT value FROM json_each(NEW.unit_ids));
    UPDATE vms SET status = 'terminated', termination_reason = 'reclaimed', terminated_at = NEW.at
        WHERE status = 'running' AND id IN (SELECT value FROM json_each(NEW.terminated));
    UPDATE vm_units SET running = 0
        WHERE running = 1 AND vm_id IN (SELECT value FROM json_each(NEW.terminated));
    UPDATE reservations SET updated_at = NEW.at WHERE id = NEW.reservation_id;
END;
