-- etcd snapshots and recovery (issue 20), PostgreSQL dialect. Keep in step with
-- migrations/sqlite/0018_etcd_snapshots.sql.

-- One row per snapshot attempt. Inserted ('taking') before the first byte is asked of the node,
-- so an attempt cut short by a crash is found and marked 'failed' later; 'verified' once the
-- stored object was read back, decrypted and matched what the node streamed; 'deleted' once
-- retention removed its object (the row stays as history).
CREATE TABLE etcd_snapshots (
    id                 UUID PRIMARY KEY NOT NULL,
    cluster            TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('taking', 'verified', 'failed', 'deleted')),
    store              TEXT NOT NULL,      -- the store's URL (s3://bucket/prefix, file:///path); no credentials
    object             TEXT NOT NULL,      -- the object's key under the store
    instance           TEXT NOT NULL,      -- the Plinth instance that took it
    requested_by       TEXT NOT NULL,      -- 'plinth' (schedule) or the token's name
    started_at         TIMESTAMPTZ NOT NULL,
    finished_at        TIMESTAMPTZ,
    verified_at        TIMESTAMPTZ,
    taken_from         TEXT,               -- the control plane it was streamed from
    taken_from_address TEXT,
    talos_version      TEXT,
    kubernetes_version TEXT,
    nodes              TEXT NOT NULL DEFAULT '[]',  -- JSON: the cluster's nodes at the time
    size_bytes         BIGINT,            -- the snapshot as etcd wrote it
    stored_bytes       BIGINT,            -- the encrypted object
    sha256             TEXT,               -- of the snapshot as etcd wrote it (hex)
    revision           BIGINT,            -- etcd's revision in the snapshot
    key_fingerprint    TEXT,               -- which Plinth key sealed it (HMAC of a constant; no key)
    error              TEXT
);
CREATE INDEX etcd_snapshots_by_cluster ON etcd_snapshots (cluster, started_at);

-- The turn to take a cluster's snapshot: one instance at a time when several share a database.
-- Held until `until`; an instance that died loses it when it expires.
CREATE TABLE etcd_snapshot_turns (
    cluster  TEXT PRIMARY KEY NOT NULL,
    instance TEXT NOT NULL,
    until    TIMESTAMPTZ NOT NULL
);

-- A cluster's one permitted re-bootstrap (etcd recovered from a snapshot): the primary key is
-- the rule. Claimed ('calling') before the snapshot is uploaded to the node, the outcome after.
CREATE TABLE cluster_recoveries (
    cluster      TEXT PRIMARY KEY NOT NULL,
    attempt_id   UUID NOT NULL,
    snapshot_id  UUID NOT NULL REFERENCES etcd_snapshots (id),
    node         TEXT NOT NULL,
    node_address TEXT NOT NULL,
    instance     TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    forced       BOOLEAN NOT NULL DEFAULT FALSE,   -- started although etcd had quorum (typed confirmation)
    state        TEXT NOT NULL CHECK (state IN ('calling', 'done', 'failed')),
    claimed_at   TIMESTAMPTZ NOT NULL,
    finished_at  TIMESTAMPTZ,
    detail       TEXT
);
