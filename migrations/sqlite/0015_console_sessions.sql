-- Web console sessions, minted from an API token at sign-in. Only the SHA-256 of the session id
-- (the cookie's value) is stored; a session ends at its expiry, at sign-out (the row is deleted)
-- and with its token (revoked, expired or deleted).
CREATE TABLE console_sessions (
    session_hash  BLOB PRIMARY KEY NOT NULL CHECK (length(session_hash) = 32),
    token_id      BLOB NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at    TEXT NOT NULL,
    expires_at    TEXT NOT NULL
);
CREATE INDEX console_sessions_token_idx ON console_sessions (token_id);
CREATE INDEX console_sessions_expiry_idx ON console_sessions (expires_at);
