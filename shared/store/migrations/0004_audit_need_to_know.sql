-- Schema 4: audit events by need to know (orgs whose VMs an event terminated see only their own
-- part), the client's request id beside the server's, and hashes keyed with `audit_key`
-- from version 2 on (earlier events keep their version-1 hashes).

ALTER TABLE audit_events ADD COLUMN client_request_id TEXT;

ALTER TABLE audit_events ADD COLUMN vm_owners TEXT NOT NULL DEFAULT '[]';

ALTER TABLE audit_events ADD COLUMN hash_version INTEGER NOT NULL DEFAULT 1;
