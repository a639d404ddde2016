-- Schema 11: the events feed's long polls are bounded, per key and over the whole deployment.
--
-- A poll that has to wait first takes a place here (one statement that counts the places
-- still held and inserts only under both bounds), and gives it back when it answers. A place
-- whose guest never gave it back (its instance was stopped) lapses at `until`, the latest the
-- poll could have answered; every new place sweeps the lapsed ones (objects.sql).

CREATE TABLE feed_waits (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    until INTEGER NOT NULL
);

CREATE INDEX feed_waits_by_key ON feed_waits(key_id, until);

CREATE INDEX feed_waits_by_end ON feed_waits(until);
