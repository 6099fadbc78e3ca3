CREATE TABLE IF NOT EXISTS task_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    fence BIGINT NOT NULL
);
