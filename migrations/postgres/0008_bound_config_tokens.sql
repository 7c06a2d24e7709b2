-- A config token is bound to the address that asked for the install script (the machine's own)
-- and serves once.
ALTER TABLE provision_windows ADD COLUMN token_ip TEXT;
ALTER TABLE provision_windows ADD COLUMN token_used_at TIMESTAMPTZ;
