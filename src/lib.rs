//! Narya host: a daemon that provisions development environments, and its client.

pub mod api;
pub mod auth;
pub mod backend;
pub mod check_config;
pub mod client;
pub mod config;
pub mod conformance;
pub mod daemon;
pub mod devkeys;
pub mod disk;
pub mod environments;
pub mod events;
pub mod github;
pub mod metrics;
pub mod model;
pub mod organisation;
pub mod store;
