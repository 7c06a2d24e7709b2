-- Rolling Talos upgrades (issue 20), SQLite dialect. Keep in step with
-- migrations/postgres/0017_upgrades.sql.

-- One row per rollout of a cluster to a Talos version. The partial unique index is the rule "one
-- active rollout per cluster": two instances starting one at the same moment get one row and one
-- unique violation. `owner` / `lease_until` name the instance that drives the rollout: every write
-- of the driver is conditional on holding the lease, and another instance takes it over only
-- after it ran out (the driver was killed or stalled).
CREATE TABLE upgrade_rollouts (
    id                   BLOB PRIMARY KEY NOT NULL,
    cluster              TEXT NOT NULL,
    to_version           TEXT NOT NULL,
    schematic_id         TEXT,
    installer            TEXT NOT NULL,
    state                TEXT NOT NULL
                         CHECK (state IN ('running', 'paused', 'done', 'failed', 'aborted')),
    requested_by         TEXT NOT NULL,
    owner                TEXT,
    lease_until          TEXT,
    node_timeout_seconds INTEGER NOT NULL,
    max_workers_per_rack INTEGER NOT NULL,
    snapshot             TEXT,      -- JSON: the etcd snapshot the pre-check found
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL,
    finished_at          TEXT,
    error                TEXT
);
CREATE UNIQUE INDEX upgrade_rollouts_one_active ON upgrade_rollouts (cluster)
    WHERE state IN ('running', 'paused');
CREATE INDEX upgrade_rollouts_cluster_idx ON upgrade_rollouts (cluster, created_at);

-- The plan of a rollout, one row per node in order, moved on step by step with a
-- compare-and-set: a node that is done is never started again.
CREATE TABLE upgrade_nodes (
    rollout_id   BLOB NOT NULL REFERENCES upgrade_rollouts (id) ON DELETE CASCADE,
    machine_id   BLOB NOT NULL,         -- no foreign key: the record outlives the machine
    position     INTEGER NOT NULL,
    batch        INTEGER NOT NULL,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('control-plane', 'worker')),
    rack         TEXT,
    address      TEXT NOT NULL,
    from_version TEXT NOT NULL,
    method       TEXT NOT NULL CHECK (method IN ('machine', 'lifecycle')),
    installer    TEXT NOT NULL,
    step         TEXT NOT NULL CHECK (step IN ('pending', 'upgrading', 'rebooting', 'verifying',
                      'done', 'skipped', 'failed', 'rolled_back', 'aborted')),
    boot_id      TEXT,
    started_at   TEXT,
    deadline     TEXT,
    finished_at  TEXT,
    seen         TEXT,
    PRIMARY KEY (rollout_id, machine_id),
    UNIQUE (rollout_id, position)
);
