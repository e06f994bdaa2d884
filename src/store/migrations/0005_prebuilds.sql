-- Prebuilds: what a successful setup made (the machine's writable layer, kept by the runtime
-- under `layer`, and a copy of the workspace), reused by creates of the same key.
CREATE TABLE prebuilds (
    -- sha256 over everything that shapes it: organisation, image digest, setup script,
    -- repository and commit, and the machine's user, workspace path and limits
    key                     TEXT PRIMARY KEY NOT NULL,
    organisation            TEXT NOT NULL,
    image_digest            TEXT NOT NULL,
    -- the runtime's name for the committed layer; also names the workspace copy's directory
    layer                   TEXT NOT NULL UNIQUE,
    -- 'making' until the layer and the workspace copy are both whole: never served before
    state                   TEXT NOT NULL CHECK (state IN ('making', 'ready')),
    bytes                   INTEGER NOT NULL DEFAULT 0,
    setup_exit_code         INTEGER,
    setup_output            TEXT,
    setup_output_truncated  INTEGER NOT NULL DEFAULT 0,
    setup_started_at        TEXT NOT NULL,
    setup_finished_at       TEXT NOT NULL,
    -- unix milliseconds of its last use: the least recently used leave first
    last_used               INTEGER NOT NULL
);

-- Which prebuild an environment was provisioned from: it stays kept while one is not deleted.
CREATE TABLE prebuild_uses (
    id    TEXT PRIMARY KEY NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    key   TEXT NOT NULL
);

CREATE INDEX prebuild_uses_by_key ON prebuild_uses (key);

ALTER TABLE environments ADD COLUMN setup_prebuilt_at TEXT;
