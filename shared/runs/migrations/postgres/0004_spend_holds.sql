-- Holds on a backend's daily spend cap: money reserved by calls in flight, before they are sent,
-- by every gateway sharing the store. A hold is settled (removed, its actual cost added to
-- `spend`) when its call returns; one past `expires_at` (its gateway died with the call in
-- flight) becomes spend at its reserved amount, so a crash cannot hide calls a provider served.
CREATE TABLE spend_holds (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    day DATE NOT NULL,
    backend TEXT NOT NULL,
    nano_usd BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX spend_holds_day ON spend_holds (day, backend);
