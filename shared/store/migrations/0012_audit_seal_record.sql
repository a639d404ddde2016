-- Schema 12: the sealing of the events of earlier builds leaves a record, keyed like the
-- events, of when it happened and how far it reached.
--
-- Sealing trusts what it seals: a trail written wholly unkeyed cannot be told from one
-- rewritten so by someone without the key. The record makes a sealing visible: verification
-- reports when the trail was sealed, refuses a record that does not match its MAC, and
-- refuses a trail that is missing its record or has events past it. A sealing dated later
-- than the upgrade that sealed the trail means the trail was put back and sealed again.

CREATE TABLE audit_seals (
    chain TEXT PRIMARY KEY,
    through_seq INTEGER NOT NULL,
    through_hash TEXT NOT NULL,
    sealed_at INTEGER NOT NULL,
    mac TEXT NOT NULL
);
