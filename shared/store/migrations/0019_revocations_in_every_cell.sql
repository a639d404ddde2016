-- Schema 19: the market may be partitioned over several databases (cells), and a key lives
-- in the directory's. Each cell keeps the ids of revoked keys, written there before the
-- revocation is answered, so that its write statement refuses a revoked key as the
-- directory's does (the trigger of `writes`, in schema/objects.sql).
CREATE TABLE revoked_keys (
    id TEXT PRIMARY KEY,
    revoked_at INTEGER NOT NULL
) WITHOUT ROWID;
