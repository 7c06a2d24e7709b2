-- Reinstall workflows, SQLite dialect. Keep in step with migrations/postgres/0005_reinstalls.sql.
-- One row per machine: its current (or last) reinstall. The workflow engine keeps no state in
-- memory: every tick reads the active rows and moves them on with compare-and-set updates on
-- `stage`, so a restart (or kill -9) resumes where the database says, and two instances sharing
-- PostgreSQL never both act on one stage.
CREATE TABLE reinstalls (
    machine_id      BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    stage           TEXT NOT NULL CHECK (stage IN ('power', 'netboot', 'config', 'talos_api', 'done', 'failed')),
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
    error           TEXT
);
CREATE INDEX reinstalls_active_idx ON reinstalls (stage) WHERE stage NOT IN ('done', 'failed');
