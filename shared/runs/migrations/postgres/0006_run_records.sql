-- Open runs' records as rows (RunPipelineRequest.open, AppendRecords): a run of any size is
-- read a page at a time instead of living in its request.
CREATE TABLE run_records (
    run_id    TEXT NOT NULL,
    idx       BIGINT NOT NULL,
    record_id TEXT NOT NULL,
    record    BYTEA NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE UNIQUE INDEX run_records_id ON run_records (run_id, record_id) WHERE record_id <> '';

-- Per open run: the records it holds and whether it is sealed (takes no more).
CREATE TABLE run_inputs (
    run_id TEXT PRIMARY KEY,
    total  BIGINT NOT NULL,
    sealed BOOLEAN NOT NULL
);
