-- Schema 9: a write is one statement, and writes about different nodes never conflict. Each
-- node's events form a chain of their own, as do the events about orgs and keys; an event's
-- place is (chain, chain_seq), unique, and a write re-checks at the database that the chain
-- it was planned against has not moved. Every event written before keeps its place and its
-- hash in the one chain it was written in, `trail`, which no event joins any more.

ALTER TABLE audit_events ADD COLUMN chain TEXT NOT NULL DEFAULT 'trail';

ALTER TABLE audit_events ADD COLUMN chain_seq INTEGER;

UPDATE audit_events SET chain_seq = seq;

CREATE UNIQUE INDEX audit_by_chain ON audit_events(chain, chain_seq);
