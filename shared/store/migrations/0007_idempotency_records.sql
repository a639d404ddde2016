-- Idempotency records live beside the writes they report, committed with them (see
-- idempotency.rs). Each insert sweeps up to two expired records through the expiry index,
-- so storage stays bounded at O(1) cost per request.

CREATE TABLE idempotency_records (
    caller_key_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    response TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (caller_key_id, idempotency_key)
);

CREATE INDEX idempotency_records_by_expiry ON idempotency_records(expires_at);

CREATE TRIGGER idempotency_records_sweep
    AFTER INSERT ON idempotency_records
    BEGIN
        DELETE FROM idempotency_records WHERE rowid IN (
            SELECT rowid FROM idempotency_records
            WHERE expires_at <= NEW.created_at
            ORDER BY expires_at LIMIT 2);
    END;
