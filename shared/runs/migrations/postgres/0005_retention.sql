-- Store-wide chores done by one gateway at a time (the retention sweep): who holds each, and
-- until when.
CREATE TABLE store_leases (
    name        TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL
);

-- Finished runs by age, for the retention sweep.
CREATE INDEX runs_finished_created ON runs (created_at) WHERE state IN (5, 6, 7, 8);
