-- An open run spread over the gateways sharing the store: its records are claimed in chunks.
-- `chunked` is the next record index not yet in a chunk; `spread` says the run's executor lets
-- other gateways claim chunks (a run with a budget stays on one gateway).
ALTER TABLE run_inputs ADD COLUMN chunked BIGINT NOT NULL DEFAULT 0;
ALTER TABLE run_inputs ADD COLUMN spread BOOLEAN NOT NULL DEFAULT false;

-- One chunk of records [first, first + count): held by the claim `token` of gateway `owner`
-- until `lease_until` (renewed with each write of its results), then `done`. `usage` is what the
-- claiming gateway spent on it when that gateway is not the run's executor (encoded Usage).
CREATE TABLE run_chunks (
    run_id      TEXT NOT NULL,
    first       BIGINT NOT NULL,
    count       INTEGER NOT NULL,
    owner       TEXT NOT NULL,
    token       TEXT NOT NULL,
    claims      INTEGER NOT NULL DEFAULT 1,
    lease_until TIMESTAMPTZ NOT NULL,
    done        BOOLEAN NOT NULL DEFAULT false,
    usage       BYTEA,
    PRIMARY KEY (run_id, first)
);
CREATE INDEX run_chunks_open ON run_chunks (run_id, lease_until) WHERE NOT done;
