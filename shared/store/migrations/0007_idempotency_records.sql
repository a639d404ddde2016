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
