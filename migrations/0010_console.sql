-- 0010: the operator console's own tables (common/store/console_store.c,
-- chargectl console token). None is read or written by a charge's path.

-- Who may sign in to the console. Only the SHA-256 (hex) of a token's
-- secret is kept: the secret is shown once, when the token is made, and a
-- copy of this table lets no one in. A revoked token stays, for the
-- record; its name may then be given to a new one.
CREATE TABLE console_tokens (
    id                  bigserial PRIMARY KEY,
    name                text NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 128),
    role                text NOT NULL CHECK (role IN ('viewer', 'operator')),
    token_sha256        text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    created_by          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_used_at        timestamptz,                -- its last sign-in
    revoked_at          timestamptz
);
-- A name is the actor of the action log: one live token per name.
CREATE UNIQUE INDEX console_tokens_live_name ON console_tokens (name)
    WHERE revoked_at IS NULL;

-- Signed-in sessions, here rather than in a console's memory: any replica
-- answers a session, and a revoked token's sessions are refused by the
-- very next request (every look-up joins the token). The cookie's value is
-- kept as its SHA-256 only. The CSRF token is kept as it is: it is handed
-- back to the page, and is worth nothing without the cookie.
CREATE TABLE console_sessions (
    session_sha256      text PRIMARY KEY CHECK (session_sha256 ~ '^[0-9a-f]{64}$'),
    token_id            bigint NOT NULL REFERENCES console_tokens (id) ON DELETE CASCADE,
    csrf_token          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL
);
-- A revocation ends the token's sessions; a sign-in removes expired ones.
CREATE INDEX console_sessions_token ON console_sessions (token_id);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- Every action taken through the console or on its tokens, appended only.
-- clock_timestamp(): actions of one transaction keep their order in time.
-- Listed newest first by id.
CREATE TABLE console_actions (
    id                  bigserial PRIMARY KEY,
    at                  timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor               text NOT NULL,              -- a token's name, an OS user
    action              text NOT NULL,              -- login, resolve, token_add, ...
    target              text,                       -- an attempt id, a token's name
    outcome             text NOT NULL,              -- ok, refused, conflict, ...
    detail              jsonb NOT NULL DEFAULT '{}'
                        CHECK (jsonb_typeof(detail) = 'object')
);
