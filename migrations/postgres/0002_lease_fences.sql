CREATE TABLE IF NOT EXISTS lease_fences (
    name TEXT PRIMARY KEY,
    fence BIGINT NOT NULL
);
