-- Runs, their event logs and checkpoints, shared by every gateway on this database. A run is
-- executed by the gateway named in `owner` while `lease_until` is in the future.
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    created_at  BIGINT NOT NULL,
    state       INTEGER NOT NULL,
    kind        INTEGER NOT NULL,
    run         BYTEA NOT NULL,
    request     BYTEA NOT NULL,
    owner       TEXT,
    lease_until TIMESTAMPTZ
);
CREATE INDEX runs_created ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_unfinished ON runs (lease_until) WHERE state NOT IN (5, 6, 7, 8);

CREATE TABLE events (
    run_id   TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    event    BYTEA NOT NULL,
    PRIMARY KEY (run_id, sequence)
);

CREATE TABLE checkpoints (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  BYTEA NOT NULL,
    PRIMARY KEY (run_id, key)
);

-- Controls (pause, resume, cancel, ...) sent to a gateway that does not execute the run, for
-- the one that does.
CREATE TABLE controls (
    id       BIGSERIAL PRIMARY KEY,
    run_id   TEXT NOT NULL,
    request  BYTEA NOT NULL,
    posted_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX controls_run ON controls (run_id);
