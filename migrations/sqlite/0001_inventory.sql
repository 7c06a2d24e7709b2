-- Inventory schema, SQLite dialect. Keep in step with migrations/postgres/0001_inventory.sql.
CREATE TABLE machines (
    id            BLOB PRIMARY KEY NOT NULL,
    hostname      TEXT UNIQUE CHECK (hostname IS NULL OR hostname = lower(hostname)),
    smbios_uuid   BLOB UNIQUE,
    serial        TEXT UNIQUE,
    asset_tag     TEXT UNIQUE,
    manufacturer  TEXT,
    model         TEXT,
    site          TEXT,
    rack          TEXT,
    rack_unit     INTEGER CHECK (rack_unit BETWEEN 1 AND 60),
    role          TEXT CHECK (role IN ('control-plane', 'worker')),
    cluster       TEXT,
    profile       TEXT,
    state         TEXT NOT NULL CHECK (state IN ('discovered', 'registered', 'inspecting', 'ready',
                                                 'provisioning', 'installed', 'failed', 'maintenance')),
    state_reason  TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    version       INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1)
);
CREATE INDEX machines_state_idx ON machines (state);
CREATE INDEX machines_cluster_idx ON machines (cluster);
CREATE INDEX machines_rack_idx ON machines (rack);

CREATE TABLE interfaces (
    machine_id  BLOB NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL CHECK (position >= 0),
    mac         TEXT NOT NULL UNIQUE CHECK (length(mac) = 17),
    ipv4        TEXT UNIQUE,
    boot        BOOLEAN NOT NULL DEFAULT FALSE,
    name        TEXT,
    PRIMARY KEY (machine_id, position)
);
CREATE UNIQUE INDEX interfaces_one_boot_nic ON interfaces (machine_id) WHERE boot;

CREATE TABLE disks (
    machine_id  BLOB NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL CHECK (position >= 0),
    serial      TEXT,
    wwid        TEXT,
    model       TEXT,
    size_bytes  INTEGER CHECK (size_bytes > 0),
    disk_type   TEXT CHECK (disk_type IN ('nvme', 'ssd', 'hdd')),
    bus_path    TEXT,
    data_disk   BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (machine_id, position)
);

CREATE TABLE bmcs (
    machine_id           BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    url                  TEXT NOT NULL,
    username             TEXT NOT NULL,
    password_ciphertext  BLOB,
    tls_mode             TEXT NOT NULL CHECK (tls_mode IN ('verify', 'pinned', 'insecure')),
    fingerprint          TEXT,
    CHECK ((tls_mode = 'pinned') = (fingerprint IS NOT NULL))
);

-- Append-only: the triggers refuse to rewrite history. No foreign key, so a deleted machine's
-- history stays.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  BLOB,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      TEXT NOT NULL,
    at          TEXT NOT NULL
);
CREATE INDEX events_machine_idx ON events (machine_id, id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

CREATE TABLE api_tokens (
    id          BLOB PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    token_hash  BLOB NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at  TEXT NOT NULL,
    expires_at  TEXT,
    revoked_at  TEXT
);
