-- Schema 8: notice for spot buyers (issue 14). A reclaim may give the spot VMs on the units it
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

-- A deadline only ever moves earlier, and a VM's notice is never taken away.
CREATE TRIGGER no_notice_lengthened
    BEFORE UPDATE OF terminates_at ON vms
    WHEN OLD.terminates_at IS NOT NULL
        AND (NEW.terminates_at IS NULL OR NEW.terminates_at > OLD.terminates_at)
    BEGIN SELECT RAISE(ABORT, 'refused: notice-lengthened'); END;

-- A notice is given to running spot VMs only.
CREATE TRIGGER no_notice_on_non_spot_vm
    BEFORE UPDATE OF terminates_at ON vms
    WHEN NEW.terminates_at IS NOT NULL AND NEW.tier <> 'spot'
    BEGIN SELECT RAISE(ABORT, 'refused: notice-on-non-spot-vm'); END;

-- A release that ended (released_until passed) no longer keeps non-spot VMs off the unit.
DROP TRIGGER no_non_spot_vm_on_released_unit;

CREATE TRIGGER no_non_spot_vm_on_released_unit
    BEFORE INSERT ON vm_units
    WHEN NEW.running = 1 AND NEW.tier <> 'spot' AND EXISTS (
        SELECT 1 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id
        WHERE ru.node_id = NEW.node_id AND ru.unit_id = NEW.unit_id AND ru.released = 1
          AND (ru.released_until IS NULL OR ru.released_until > NEW.placed_at)
          AND r.state = 'live' AND r.starts_at <= NEW.placed_at
          AND (r.ends_at IS NULL OR r.ends_at > NEW.placed_at))
    BEGIN SELECT RAISE(ABORT, 'refused: released-spot-only'); END;

-- Releasing again a unit whose timed release ended (its flag still 1) is a release too: the
-- guard looks at every write of the flag or its end that leaves the unit released.
DROP TRIGGER no_release_of_unit_running_non_spot_vm;

CREATE TRIGGER no_release_of_unit_running_non_spot_vm
    BEFORE UPDATE OF released, released_until ON reservation_units
    WHEN NEW.released = 1 AND EXISTS (
        SELECT 1 FROM vm_units v
        WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
          AND v.running = 1 AND v.tier <> 'spot')
    BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END;

-- The capacity change now also carries deadlines and a release's end.
DROP TRIGGER capacity_change_applies;

DROP VIEW capacity_changes;

CREATE VIEW capacity_changes AS
    SELECT seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, vm_id,
        org_id, subject_id, unit_ids, terminated, skipped, reason, request_id,
        client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash, deadlines,
        release_until
    FROM audit_events
    WHERE action IN ('reservation.release', 'reservation.reclaim');

CREATE TRIGGER capacity_change_applies
    INSTEAD OF INSERT ON capacity_changes
BEGIN
    SELECT RAISE(ABORT, 'refused: not-a-capacity-change')
        WHERE NEW.action NOT IN ('reservation.release', 'reservation.reclaim');
    SELECT RAISE(ABORT, 'refused: release-until-on-reclaim')
        WHERE NEW.action = 'reservation.reclaim' AND NEW.release_until IS NOT NULL;
    INSERT INTO audit_events (seq, id, at, actor_key_id, actor_org_id, action, node_id,
        reservation_id, vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason,
        request_id, client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash,
        deadlines, release_until)
    VALUES (NEW.seq, NEW.id, NEW.at, NEW.actor_key_id, NEW.actor_org_id, NEW.action,
        NEW.node_id, NEW.reservation_id, NEW.vm_id, NEW.org_id, NEW.subject_id, NEW.unit_ids,
        NEW.terminated, NEW.skipped, NEW.reason, NEW.request_id, NEW.client_request_id,
        NEW.visible_to, NEW.vm_owners, NEW.hash_version, NEW.prev_hash, NEW.hash,
        NEW.deadlines, NEW.release_until);
    UPDATE reservation_units SET released = 1, released_until = NEW.release_until
        WHERE NEW.action = 'reservation.release'
          AND reservation_id = NEW.reservation_id
          AND (released = 0 OR released_until IS NOT NULL OR NEW.release_until IS NOT NULL)
          AND unit_id IN (SELECT value FROM json_each(NEW.unit_ids));
    UPDATE reservation_units SET released = 0, released_until = NULL
        WHERE NEW.action = 'reservation.reclaim'
          AND reservation_id = NEW.reservation_id
          AND released = 1
          AND unit_id IN (SELECT value FROM json_each(NEW.unit_ids));
    UPDATE vms SET status = 'terminated', termination_reason = 'reclaimed', terminated_at = NEW.at
        WHERE status = 'running' AND id IN (SELECT value FROM json_each(NEW.terminated))
          AND id NOT IN (SELECT key FROM json_each(NEW.deadlines));
    UPDATE vm_units SET running = 0
        WHERE running = 1 AND vm_id IN (SELECT value FROM json_each(NEW.terminated))
          AND vm_id NOT IN (SELECT key FROM json_each(NEW.deadlines));
    UPDATE vms SET
            terminates_at = (SELECT value FROM json_each(NEW.deadlines) d WHERE d.key = vms.id),
            noticed_at = NEW.at,
            interruption_reason = CASE NEW.action
                WHEN 'reservation.release' THEN 'release-ends' ELSE 'reclaimed' END,
            interruption_reservation_id = NEW.reservation_id,
            interruption_unit_ids = (SELECT json_group_array(unit_id) FROM
                (SELECT unit_id FROM vm_units vu WHERE vu.vm_id = vms.id
                   AND vu.unit_id IN (SELECT value FROM json_each(NEW.unit_ids))
                 ORDER BY position))
        WHERE status = 'running' AND id IN (SELECT key FROM json_each(NEW.deadlines))
          AND (terminates_at IS NULL
               OR terminates_at > (SELECT value FROM json_each(NEW.deadlines) d WHERE d.key = vms.id));
    UPDATE reservations SET updated_at = NEW.at WHERE id = NEW.reservation_id;
END;
