-- Environments: one row per identifier on this host. The row is the single source of truth of
-- the create flow: inserted before anything is made, completed in one transaction at the end.
CREATE TABLE environments (
    id                      TEXT PRIMARY KEY NOT NULL,
    organisation            TEXT NOT NULL,
    person                  TEXT NOT NULL,
    -- sha256 over the setup script and repository: tells a repeat from a different create
    fingerprint             TEXT NOT NULL,
    setup_script            TEXT,
    repository              TEXT,
    image_digest            TEXT NOT NULL,
    -- 0 while provisioning: a row left at 0 by a dead daemon has an unrecorded setup state
    setup_recorded          INTEGER NOT NULL DEFAULT 0,
    status                  TEXT NOT NULL CHECK (status IN ('ready', 'degraded', 'gone', 'unusable')),
    status_detail           TEXT,
    setup_state             TEXT CHECK (setup_state IN ('succeeded', 'failed', 'timed_out')),
    setup_step              TEXT CHECK (setup_step IN ('clone', 'setup')),
    setup_exit_code         INTEGER,
    setup_output            TEXT,
    setup_output_truncated  INTEGER,
    setup_started_at        TEXT,
    setup_finished_at       TEXT,
    created_at              TEXT NOT NULL,
    updated_at              TEXT NOT NULL
);

CREATE INDEX environments_by_organisation ON environments (organisation, id);

-- The GitHub App installation each organisation connected.
CREATE TABLE github_installations (
    organisation     TEXT PRIMARY KEY NOT NULL,
    installation_id  INTEGER NOT NULL,
    connected_at     TEXT NOT NULL
);
