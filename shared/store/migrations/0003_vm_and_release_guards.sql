-- Schema 3: close the write paths the first guards did not cover: a VM row brought back to
-- running (or re-tiered), and a unit inserted already released.

CREATE TRIGGER no_vm_row_revived_or_retiered
    BEFORE UPDATE OF running, tier ON vm_units
    WHEN NEW.tier <> OLD.tier OR (NEW.running = 1 AND OLD.running = 0)
    BEGIN SELECT RAISE(ABORT, 'refused: vm-rows-are-final'); END;

CREATE TRIGGER no_released_insert_on_unit_running_non_spot_vm
    BEFORE INSERT ON reservation_units
    WHEN NEW.released = 1 AND EXISTS (
        SELECT 1 FROM vm_units v
        WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
          AND v.running = 1 AND v.tier <> 'spot')
    BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END;
