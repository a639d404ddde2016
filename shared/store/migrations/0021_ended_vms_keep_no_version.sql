-- Schema 21: a VM that ended keeps no version. Its row never changes again, so no plan needs
-- its version to tell that it moved; kept, the versions of every VM a node ever ran pushed
-- its live facts apart, and a placement or a termination changed two or three pages of
-- `fact_versions` instead of one. The trigger `fact_vm_ended` (schema/objects.sql) drops the
-- version when a VM ends; this drops those of the VMs that ended before.
-- From this schema on, the write statement names the schema version its build writes
-- (`writes.schema_version`), and the write trigger refuses the write of a newer build as
-- behind: any write brings the database up to date, whatever a migration changes.
DELETE FROM fact_versions
    WHERE fact ->> 0 = 'node' AND fact ->> 2 = 'vm'
      AND EXISTS (SELECT 1 FROM vms WHERE vms.id = fact_versions.fact ->> 3
                  AND vms.status <> 'running');
