-- Spend per model backend and UTC day, in nano-dollars (1e-9 USD), added to atomically by every
-- gateway sharing the store: what a backend's daily spend cap (backends.<name>.daily_spend_usd)
-- is checked against.
CREATE TABLE spend (
    day DATE NOT NULL,
    backend TEXT NOT NULL,
    nano_usd BIGINT NOT NULL,
    PRIMARY KEY (day, backend)
);
