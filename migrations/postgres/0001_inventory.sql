-- Inventory schema, PostgreSQL dialect. Keep in step with migrations/sqlite/0001_inventory.sql.
CREATE TABLE machines (
    id            UUID PRIMARY KEY,
    hostname      TEXT CONSTRAINT machines_hostname_key UNIQUE
                  CHECK (hostname IS NULL OR hostname = lower(hostname)),
    smbios_uuid   UUID CONSTRAINT machines_smbios_uuid_key UNIQUE,
    serial        TEXT CONSTRAINT machines_serial_key UNIQUE,
    asset_tag     TEXT CONSTRAINT machines_asset_tag_key UNIQUE,
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
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    version       BIGINT NOT NULL DEFAULT 1 CHECK (version >= 1)
);
CREATE INDEX machines_state_idx ON machines (state);
CREATE INDEX machines_cluster_idx ON machines (cluster);
CREATE INDEX machines_rack_idx ON machines (rack);

CREATE TABLE interfaces (
    machine_id  UUID NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL CHECK (position >= 0),
    mac         TEXT NOT NULL CONSTRAINT interfaces_mac_key UNIQUE CHECK (length(mac) = 17),
    ipv4        TEXT CONSTRAINT interfaces_ipv4_key UNIQUE,
    boot        BOOLEAN NOT NULL DEFAULT FALSE,
    name        TEXT,
    PRIMARY KEY (machine_id, position)
);
CREATE UNIQUE INDEX interfaces_one_boot_nic ON interfaces (machine_id) WHERE boot;

CREATE TABLE disks (
    machine_id  UUID NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL CHECK (position >= 0),
    serial      TEXT,
    wwid        TEXT,
    model       TEXT,
    size_bytes  BIGINT CHECK (size_bytes > 0),
    disk_type   TEXT CHECK (disk_type IN ('nvme', 'ssd', 'hdd')),
    bus_path    TEXT,
    data_disk   BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (machine_id, position)
);

CREATE TABLE bmcs (
    machine_id           UUID PRIMARY KEY REFERENCES machines (id) ON DELETE CASCADE,
    url                  TEXT NOT NULL,
    username             TEXT NOT NULL,
    password_ciphertext  BYTEA,
    tls_mode             TEXT NOT NULL CHECK (tls_mode IN ('verify', 'pinned', 'insecure')),
    fingerprint          TEXT,
    CHECK ((tls_mode = 'pinned') = (fingerprint IS NOT NULL))
);

-- Append-only: the trigger refuses to rewrite history. No foreign key, so a deleted machine's
-- history stays.
CREATE TABLE events (
    id          BIGSERIAL PRIMARY KEY,
    machine_id  UUID,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      JSONB NOT NULL,
    at          TIMESTAMPTZ NOT NULL
);
CREATE INDEX events_machine_idx ON events (machine_id, id);
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only';
END;
$$;
CREATE TRIGGER events_no_rewrite BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

CREATE TABLE api_tokens (
    id          UUID PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    token_hash  BYTEA NOT NULL CONSTRAINT api_tokens_hash_key UNIQUE CHECK (length(token_hash) = 32),
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ
);
