-- DHCP leases, SQLite dialect. One row per address: the primary key is what makes two instances
-- (or two requests) unable to hand one address to two MACs. Times are Unix milliseconds.
CREATE TABLE dhcp_leases (
    ip                INTEGER PRIMARY KEY NOT NULL CHECK (ip BETWEEN 0 AND 4294967295),
    subnet            TEXT NOT NULL,
    mac               TEXT NOT NULL CHECK (length(mac) = 17),
    state             TEXT NOT NULL CHECK (state IN ('offered', 'bound', 'released', 'declined', 'expired')),
    expires_ms        INTEGER NOT NULL,
    hostname          TEXT,
    relay_circuit_id  TEXT,
    relay_remote_id   TEXT,
    giaddr            TEXT,
    updated_ms        INTEGER NOT NULL
);
CREATE INDEX dhcp_leases_mac_idx ON dhcp_leases (mac, subnet);
