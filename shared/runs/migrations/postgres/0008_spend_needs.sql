-- Per backend and UTC day, the least a call refused on its daily cap needed, in nano-dollars:
-- while less than that is left, new runs that use the backend are refused at admission, by every
-- gateway and every new process sharing the store.
CREATE TABLE spend_needs (
    day DATE NOT NULL,
    backend TEXT NOT NULL,
    nano_usd BIGINT NOT NULL,
    PRIMARY KEY (day, backend)
);
