-- Each row names its machine: the runtime's name for it is internal (derived from the
-- organisation and the identifier), so every identifier works on every back end; rows made
-- before that named their machine by the identifier. A deleted environment keeps its row, as `gone`, until `deleted_at` (unix seconds) is older than
-- the host's retention; a step the host stopped during is recorded as `interrupted`. SQLite cannot
-- change a CHECK constraint in place, so the table is rebuilt with the same rows.
CREATE TABLE environments_v2 (
    id                      TEXT PRIMARY KEY NOT NULL,
    organisation            TEXT NOT NULL,
    person                  TEXT NOT NULL,
    fingerprint             TEXT NOT NULL,
    setup_script            TEXT,
    repository              TEXT,
    image_digest            TEXT NOT NULL,
    -- 0 while provisioning or replacing: a row left at 0 by a dead daemon has an unrecorded setup
    -- state; setup_step and setup_started_at then say which step was under way
    setup_recorded          INTEGER NOT NULL DEFAULT 0,
    status                  TEXT NOT NULL CHECK (status IN ('ready', 'degraded', 'gone', 'unusable')),
    status_detail           TEXT,
    setup_state             TEXT CHECK (setup_state IN ('succeeded', 'failed', 'timed_out', 'interrupted')),
    setup_step              TEXT CHECK (setup_step IN ('clone', 'setup')),
    setup_exit_code         INTEGER,
    setup_output            TEXT,
    setup_output_truncated  INTEGER,
    setup_started_at        TEXT,
    setup_finished_at       TEXT,
    created_at              TEXT NOT NULL,
    updated_at              TEXT NOT NULL,
    deleted_at              INTEGER,
    machine                 TEXT NOT NULL
);

INSERT INTO environments_v2 (id, organisation, person, fingerprint, setup_script, repository,
    image_digest, setup_recorded, status, status_detail, setup_state, setup_step, setup_exit_code,
    setup_output, setup_output_truncated, setup_started_at, setup_finished_at, created_at,
    updated_at, machine)
SELECT id, organisation, person, fingerprint, setup_script, repository, image_digest,
    setup_recorded, status, status_detail, setup_state, setup_step, setup_exit_code, setup_output,
    setup_output_truncated, setup_started_at, setup_finished_at, created_at, updated_at, id
FROM environments;

DROP TABLE environments;
ALTER TABLE environments_v2 RENAME TO environments;
CREATE INDEX environments_by_organisation ON environments (organisation, id);
