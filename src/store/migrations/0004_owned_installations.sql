-- An installation is connected only by a person who administers the account it belongs to (an
-- active owner of the organisation, or the user whose account it is). Rows from before were
-- proved by access alone, which an outside collaborator on one repository also has, so they are
-- forgotten: those organisations connect again, this time as an owner.
DELETE FROM github_installations;
