-- Issue 15 (secrets at rest, relay circuits, approved delivery), PostgreSQL dialect. Keep in step with
-- migrations/sqlite/0011_secrets_circuits_approval.sql.

-- The fingerprint of the secret key this database's sealed values are sealed with: an HMAC-SHA256
-- of a constant under the key (never the key). One row. A server whose key does not match refuses
-- to start, so a missing, wrong or different key never seals new values beside old ones.
CREATE TABLE secret_key_fingerprint (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint  TEXT NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL
);

-- `/healthz` proves the database takes writes: each instance upserts its own row.
CREATE TABLE heartbeats (
    instance  TEXT PRIMARY KEY NOT NULL,
    beat_at   TIMESTAMPTZ NOT NULL
);

-- The relay and option-82 circuit a machine's DHCP first came through (or an operator set): its
-- leases are granted only on that circuit.
CREATE TABLE dhcp_circuit_pins (
    machine_id  UUID PRIMARY KEY REFERENCES machines (id) ON DELETE CASCADE,
    relay       TEXT NOT NULL,      -- the relay agent's address (giaddr)
    circuit_id  TEXT,               -- option 82 sub-option 1 (RFC 3046), hex
    remote_id   TEXT,               -- option 82 sub-option 2, hex (recorded, not compared)
    pinned_at   TIMESTAMPTZ NOT NULL,
    pinned_by   TEXT NOT NULL       -- 'dhcp' (first seen) or the operator's token name
);

-- `delivery: approve`: the SHA-256 of the short code the boot script shows, and the operator's
-- approval of this boot's release.
ALTER TABLE provision_windows ADD COLUMN approval_code_sha256 TEXT;
ALTER TABLE provision_windows ADD COLUMN approved_at TIMESTAMPTZ;
ALTER TABLE provision_windows ADD COLUMN approved_by TEXT;
