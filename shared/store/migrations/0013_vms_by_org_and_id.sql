-- Schema 13: an org's VM listing walks what it may see instead of every VM of the platform:
-- its own VMs in the listing's order (by id) from the cursor, and the VMs that ran on the
-- units of the reservations it owns or manages.

CREATE INDEX vms_by_org_and_id ON vms(org_id, id);

CREATE INDEX vm_units_by_unit ON vm_units(node_id, unit_id, vm_id);
