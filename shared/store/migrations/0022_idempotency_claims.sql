-- Schema 22: an Idempotency-Key claimed across cells. A request's idempotency record lives in
-- its home cell, beside the write it reports; with the market in several cells a key used
-- again for a request at home in another cell would not be found there. So every keyed
-- request also claims its key in the directory, for the request it was first used with
-- (idempotency.rs): used again for any other request, whichever cell that one is at home in,
-- it is refused as with one cell. Each new claim sweeps up to two expired ones, as records do.
CREATE TABLE IF NOT EXISTS idempotency_claims (
    caller_key_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (caller_key_id, idempotency_key)
);

CREATE INDEX IF NOT EXISTS idempotency_claims_by_expiry ON idempotency_claims(expires_at);
