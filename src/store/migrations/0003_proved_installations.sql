-- An installation is connected only with proof that a person of the organisation can access it
-- (their OAuth code), and to one organisation only. Rows from before were connected without
-- proof, so they are forgotten: those organisations connect again, this time with a code.
DROP TABLE github_installations;

CREATE TABLE github_installations (
    organisation     TEXT PRIMARY KEY NOT NULL,
    installation_id  INTEGER NOT NULL UNIQUE,
    -- the login of the GitHub account the installation belongs to
    account          TEXT,
    connected_at     TEXT NOT NULL
);
