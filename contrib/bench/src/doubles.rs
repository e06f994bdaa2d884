//! GitHub's double, the same the end-to-end tests use (their sources, included): the prebuild
//! rows create with a repository, cloned over loopback from a real `git http-backend`.
#![allow(dead_code)]

#[path = "../../../tests/support/github.rs"]
pub mod github;
#[path = "../../../tests/support/github_git.rs"]
mod github_git;
#[path = "../../../tests/support/github_oauth.rs"]
mod github_oauth;
#[path = "../../../tests/support/keys.rs"]
mod keys;

pub use keys::make_key;
