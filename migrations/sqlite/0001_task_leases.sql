CREATE TABLE IF NOT EXISTS task_leases (
    name TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL /* unix time in ms, from the host clock */,
    fence INTEGER NOT NULL
);
