-- `insecure-http`: the explicit consent to an http:// BMC whose password crosses the network in
-- clear. SQLite dialect; keep in step with migrations/postgres/0006_bmc_plain_http.sql. SQLite
-- cannot change a CHECK constraint, so both tables that hold a TLS mode are rebuilt as they were,
-- with the new value allowed, and their rows copied over unchanged.
CREATE TABLE bmcs_new (
    machine_id           BLOB PRIMARY KEY NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    url                  TEXT NOT NULL,
    username             TEXT NOT NULL,
    password_ciphertext  BLOB,
    tls_mode             TEXT NOT NULL CHECK (tls_mode IN ('verify', 'pinned', 'insecure', 'insecure-http')),
    fingerprint          TEXT,
    CHECK ((tls_mode = 'pinned') = (fingerprint IS NOT NULL))
);
INSERT INTO bmcs_new (machine_id, url, username, password_ciphertext, tls_mode, fingerprint)
    SELECT machine_id, url, username, password_ciphertext, tls_mode, fingerprint FROM bmcs;
DROP TABLE bmcs;
ALTER TABLE bmcs_new RENAME TO bmcs;

CREATE TABLE bmc_capabilities_new (
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
    tls_mode            TEXT CHECK (tls_mode IN ('verify', 'pinned', 'insecure', 'insecure-http')),
    probed_at           TEXT,
    last_error          TEXT,
    attempted_at        TEXT NOT NULL,
    -- Either a good probe is on record, or the attempt that failed says why.
    CHECK ((probed_at IS NULL) = (auth IS NULL)),
    CHECK (probed_at IS NOT NULL OR last_error IS NOT NULL)
);
INSERT INTO bmc_capabilities_new SELECT * FROM bmc_capabilities;
DROP TABLE bmc_capabilities;
ALTER TABLE bmc_capabilities_new RENAME TO bmc_capabilities;
