-- BMC capability records, SQLite dialect. Keep in step with migrations/postgres/0003_bmc.sql.
-- One row per machine: what its BMC could do at the last good probe, and how the last attempt
-- went. Keyed on machines (not bmcs): editing a machine rewrites its bmcs row, the record stays
-- and `bmc_url` tells whether it still describes the BMC the machine names.
CREATE TABLE bmc_capabilities (
    machine_id          BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    bmc_url             TEXT NOT NULL,
    vendor              TEXT,
    model               TEXT,
    quirks              TEXT,
    redfish_version     TEXT,
    sessions            BOOLEAN,
    auth                TEXT,
    reset_types         TEXT,  -- JSON array of ResetType values
    boot_targets        TEXT,  -- JSON array of BootSourceOverrideTarget values
    boot_mode_settable  BOOLEAN,
    virtual_media       TEXT CHECK (virtual_media IN ('system', 'manager')),
    etag_offered        BOOLEAN,
    etag_weak           BOOLEAN,
    if_match_required   BOOLEAN,
    tls_mode            TEXT CHECK (tls_mode IN ('verify', 'pinned', 'insecure')),
    probed_at           TEXT,
    last_error          TEXT,
    attempted_at        TEXT NOT NULL,
    -- Either a good probe is on record, or the attempt that failed says why.
    CHECK ((probed_at IS NULL) = (auth IS NULL)),
    CHECK (probed_at IS NOT NULL OR last_error IS NOT NULL)
);
