-- Schema 14: the events feed's waiting polls are bounded per org as well.
--
-- An org mints keys at will, so a bound per key alone would let one org hold every place of
-- the deployment. Each place records its key's org (NULL for an operator's key: the operators
-- share one bound), and the insert that takes a place counts the org's places still held.

ALTER TABLE feed_waits ADD COLUMN org_id TEXT;

CREATE INDEX feed_waits_by_org ON feed_waits(org_id, until);
