-- Cancelled reinstalls and who set a machine's state, SQLite dialect. Keep in step with
-- migrations/postgres/0010_cancel.sql.
-- A reinstall can be cancelled at any stage (`cancelled`, with who did it); a machine records who
-- set its current state (`state_by`, an event actor such as `token:alice` or `plinth`) and whether
-- a person did so (`manual_hold`): the cluster's automatic reinstall never touches a machine a
-- person marked failed. SQLite cannot alter a CHECK constraint: the table is rebuilt (nothing
-- references it).
CREATE TABLE reinstalls_new (
    machine_id      BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    stage           TEXT NOT NULL CHECK (stage IN ('power', 'netboot', 'config', 'talos_api', 'done', 'failed', 'cancelled')),
    stage_started_at TEXT NOT NULL,
    stage_deadline  TEXT NOT NULL,
    wipe            BOOLEAN NOT NULL DEFAULT FALSE,
    automatic       BOOLEAN NOT NULL DEFAULT FALSE,
    attempt         INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    event_mark      INTEGER NOT NULL DEFAULT 0,   -- events after this id belong to this attempt
    node_address    TEXT,                         -- where the config was fetched from
    requested_by    TEXT NOT NULL,
    started_at      TEXT NOT NULL,
    finished_at     TEXT,
    error           TEXT,
    cancelled_by    TEXT
);
INSERT INTO reinstalls_new (machine_id, stage, stage_started_at, stage_deadline, wipe, automatic,
    attempt, event_mark, node_address, requested_by, started_at, finished_at, error)
SELECT machine_id, stage, stage_started_at, stage_deadline, wipe, automatic, attempt, event_mark,
    node_address, requested_by, started_at, finished_at, error FROM reinstalls;
DROP TABLE reinstalls;
ALTER TABLE reinstalls_new RENAME TO reinstalls;
CREATE INDEX reinstalls_active_idx ON reinstalls (stage) WHERE stage NOT IN ('done', 'failed', 'cancelled');
ALTER TABLE machines ADD COLUMN state_by TEXT;
ALTER TABLE machines ADD COLUMN manual_hold BOOLEAN NOT NULL DEFAULT FALSE;
