-- Schema 15: writes conflict only where they really conflict, and no write needs the previous
-- event's hash when it is planned (docs/design.md, "The write path" and "The audit chains").
--
-- `fact_versions`: one row per fact a plan can depend on (a node, a unit of a node, a
-- reservation, a VM, an org, a key), counting the writes that changed it. A plan reads the
-- versions of the facts it depends on; its write statement checks them. A fact never written
-- has no row: its version is 0.
CREATE TABLE fact_versions (
    fact TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;

-- An event of hash version 5 is numbered by the write statement and MACed on its own content
-- (with `after_seq`, the newest place of its chain its writer had seen); `seal` links it to
-- everything before it, written by the writes that follow.
ALTER TABLE audit_events ADD COLUMN after_seq INTEGER;
ALTER TABLE audit_events ADD COLUMN seal TEXT;

CREATE INDEX audit_unsealed ON audit_events(chain, chain_seq) WHERE seal IS NULL AND hash_version = 5;
