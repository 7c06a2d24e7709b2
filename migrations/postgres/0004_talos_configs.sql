-- Talos machine configs, PostgreSQL dialect. Keep in step with migrations/sqlite/0004_talos_configs.sql.
-- Clusters, profiles and groups come from the declarative inventory directory (`plinth apply`).
-- Specs are JSON documents (patch texts included); anything secret is a sealed column
-- (XChaCha20-Poly1305, bound to the row), never JSON.
CREATE TABLE clusters (
    name            TEXT PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 63),
    spec            TEXT NOT NULL,
    secrets         BYTEA,           -- sealed secrets bundle (talosctl gen secrets / plinth cluster init)
    base_controlplane BYTEA,         -- sealed base config given instead of a bundle
    base_worker     BYTEA,
    secrets_sha256  TEXT NOT NULL,  -- fingerprint of whatever secret input is stored, for diffs
    updated_at      TIMESTAMPTZ NOT NULL,
    CHECK (secrets IS NOT NULL OR (base_controlplane IS NOT NULL AND base_worker IS NOT NULL))
);

CREATE TABLE profiles (
    name        TEXT PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 63),
    spec        TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE config_groups (
    kind        TEXT NOT NULL CHECK (kind IN ('site', 'rack')),
    name        TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 63),
    spec        TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, name)
);

-- Per machine: its own patches, and the config it was last served (sealed) for `config diff`.
CREATE TABLE machine_configs (
    machine_id      UUID PRIMARY KEY REFERENCES machines (id) ON DELETE CASCADE,
    patches         TEXT NOT NULL DEFAULT '[]',
    served_config   BYTEA,
    served_sha256   TEXT,
    served_at       TIMESTAMPTZ,
    CHECK ((served_config IS NULL) = (served_sha256 IS NULL))
);

-- The provisioning window of a machine: while open (not closed, not expired), its config is served
-- to a request carrying the token minted into its latest install boot. Only the token's SHA-256 is
-- stored.
CREATE TABLE provision_windows (
    machine_id    UUID PRIMARY KEY REFERENCES machines (id) ON DELETE CASCADE,
    opened_at     TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ NOT NULL,
    opened_by     TEXT NOT NULL,
    wipe          BOOLEAN NOT NULL DEFAULT FALSE,
    token_sha256  TEXT UNIQUE,
    token_minted_at TIMESTAMPTZ,
    closed_at     TIMESTAMPTZ,
    close_reason  TEXT,
    CHECK (expires_at > opened_at)
);
