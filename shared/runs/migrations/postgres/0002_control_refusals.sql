-- A control the executing gateway refused keeps its row, with the refusal (a gRPC status: code,
-- message, details), until the gateway that posted it has read it and answered its caller.
ALTER TABLE controls
    ADD COLUMN refused_code INTEGER,
    ADD COLUMN refused_message TEXT,
    ADD COLUMN refused_details BYTEA;
