-- The Talos API (issue 19), SQLite dialect. Keep in step with migrations/postgres/0007_talos_api.sql.

-- One row per cluster, ever: the primary key is the rule "bootstrap exactly once". The row is
-- inserted (state 'calling') in the transaction that claims the bootstrap, before Plinth calls
-- the node; the outcome is written after ('done'). A claim whose call provably never reached
-- the node is deleted again in one transaction with its event; a claim left 'calling' (Plinth
-- stopped mid-call, the answer was lost) is never retried automatically. 'found' records a
-- cluster whose etcd Plinth saw running without bootstrapping it.
CREATE TABLE cluster_bootstraps (
    cluster      TEXT PRIMARY KEY NOT NULL,
    attempt_id   BLOB NOT NULL,
    machine_id   BLOB REFERENCES machines (id) ON DELETE SET NULL,
    node         TEXT NOT NULL,            -- the node's name when it was claimed
    node_address TEXT NOT NULL,
    instance     TEXT NOT NULL,            -- the Plinth instance that claimed it
    requested_by TEXT NOT NULL,            -- 'plinth' (automatic) or the token's name
    state        TEXT NOT NULL CHECK (state IN ('calling', 'done', 'found')),
    claimed_at   TEXT NOT NULL,
    finished_at  TEXT,
    detail       TEXT
);

-- What a node's Talos API reported when its install was verified (Version over mTLS).
CREATE TABLE talos_nodes (
    machine_id    BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    address       TEXT NOT NULL,
    talos_version TEXT NOT NULL,
    cert_sha256   TEXT NOT NULL,
    verified_at   TEXT NOT NULL
);

-- The last measured health of each cluster (per node: version, apid, services, etcd, quorum).
CREATE TABLE cluster_health (
    cluster    TEXT PRIMARY KEY NOT NULL,
    report     TEXT NOT NULL,
    checked_at TEXT NOT NULL
);
