-- Cancelled reinstalls and who set a machine's state, PostgreSQL dialect. Keep in step with
-- migrations/sqlite/0010_cancel.sql.
-- A reinstall can be cancelled at any stage (`cancelled`, with who did it); a machine records who
-- set its current state (`state_by`, an event actor such as `token:alice` or `plinth`) and whether
-- a person did so (`manual_hold`): the cluster's automatic reinstall never touches a machine a
-- person marked failed.
ALTER TABLE reinstalls DROP CONSTRAINT reinstalls_stage_check;
ALTER TABLE reinstalls ADD CONSTRAINT reinstalls_stage_check
    CHECK (stage IN ('power', 'netboot', 'config', 'talos_api', 'done', 'failed', 'cancelled'));
ALTER TABLE reinstalls ADD COLUMN cancelled_by TEXT;
DROP INDEX reinstalls_active_idx;
CREATE INDEX reinstalls_active_idx ON reinstalls (stage) WHERE stage NOT IN ('done', 'failed', 'cancelled');
ALTER TABLE machines ADD COLUMN state_by TEXT;
ALTER TABLE machines ADD COLUMN manual_hold BOOLEAN NOT NULL DEFAULT FALSE;
