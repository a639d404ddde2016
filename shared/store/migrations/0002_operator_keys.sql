-- Schema 2: keys of platform operators, above all orgs (the first operator credential is the
-- `operator_token` variable, which is configuration, not a row).

CREATE TABLE operator_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);

CREATE INDEX operator_keys_by_creation ON operator_keys(created_at, id);
