-- `insecure-http`: the explicit consent to an http:// BMC whose password crosses the network in
-- clear. PostgreSQL dialect; keep in step with migrations/sqlite/0006_bmc_plain_http.sql.
ALTER TABLE bmcs DROP CONSTRAINT bmcs_tls_mode_check;
ALTER TABLE bmcs ADD CONSTRAINT bmcs_tls_mode_check
    CHECK (tls_mode IN ('verify', 'pinned', 'insecure', 'insecure-http'));
ALTER TABLE bmc_capabilities DROP CONSTRAINT bmc_capabilities_tls_mode_check;
ALTER TABLE bmc_capabilities ADD CONSTRAINT bmc_capabilities_tls_mode_check
    CHECK (tls_mode IN ('verify', 'pinned', 'insecure', 'insecure-http'));
