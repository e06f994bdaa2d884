//! The operations every measurement is made of, on each side: creates, deletes and execs
//! through a daemon, creates and removals with the raw runtime, each machine tracked until it is
//! gone, and the sweep of whatever a run left.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{describe, Bench, HELPERS};
use crate::raw::COMMAND_LIMIT;

impl Bench {
    /// `POST /v1/environments` for a new id: must answer 201 with a ready environment.
    pub(super) async fn create_ours(&self, id: &str) -> Result<Value> {
        Self::create_on(&self.client, &self.ours_live, id).await
    }

    /// `create_ours` on the daemon of `client`, whose environments `live` tracks.
    pub(super) async fn create_on(
        client: &Client,
        live: &Mutex<BTreeSet<String>>,
        id: &str,
    ) -> Result<Value> {
        Self::track(live, id, true);
        let answer = client
            .send_json(Method::POST, "/v1/environments", &json!({ "id": id }))
            .await?;
        if answer.status != StatusCode::CREATED {
            bail!("create of {id} answered {}", describe(&answer));
        }
        let env: Value = serde_json::from_slice(&answer.body)
            .with_context(|| format!("create of {id}: the answer is not JSON"))?;
        if env["status"] != "ready" {
            bail!("create of {id} answered 201 but not ready: {env}");
        }
        Ok(env)
    }

    pub(super) async fn delete_ours(&self, id: &str) -> Result<()> {
        Self::delete_on(&self.client, &self.ours_live, id).await
    }

    /// `delete_ours` on the daemon of `client`, whose environments `live` tracks.
    pub(super) async fn delete_on(
        client: &Client,
        live: &Mutex<BTreeSet<String>>,
        id: &str,
    ) -> Result<()> {
        let answer = client
            .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
            .await?;
        if answer.status != StatusCode::NO_CONTENT {
            bail!("delete of {id} answered {}", describe(&answer));
        }
        Self::track(live, id, false);
        Ok(())
    }

    /// `POST /v1/environments/{id}/exec {"argv": ["true"]}`: must answer 200 with exit code 0.
    pub(super) async fn exec_true_ours(&self, id: &str) -> Result<()> {
        let path = format!("/v1/environments/{id}/exec");
        let body = json!({ "argv": ["true"] });
        let sent = self.client.send_json(Method::POST, &path, &body);
        let Ok(answer) = tokio::time::timeout(COMMAND_LIMIT, sent).await else {
            bail!(
                "exec of true in {id} did not answer within {} s",
                COMMAND_LIMIT.as_secs()
            );
        };
        let answer = answer?;
        let outcome: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if answer.status != StatusCode::OK || outcome["exit_code"] != 0 {
            bail!("exec of true in {id} answered {}", describe(&answer));
        }
        Ok(())
    }

    pub(super) async fn create_raw(&self, image: &str, id: &str) -> Result<()> {
        Self::track(&self.raw_live, id, true);
        self.raw.create(image, id).await
    }

    pub(super) async fn delete_raw(&self, ids: &[String]) -> Result<()> {
        self.raw.remove(ids).await?;
        for id in ids {
            Self::track(&self.raw_live, id, false);
        }
        Ok(())
    }

    /// Deletes `ids` through the daemon, `HELPERS` at a time.
    pub(super) async fn delete_ours_all(self: &Arc<Self>, ids: Vec<String>) -> Result<()> {
        let mut results = Vec::new();
        for chunk in ids.chunks(HELPERS) {
            let mut set = JoinSet::new();
            for id in chunk {
                let (bench, id) = (self.clone(), id.clone());
                set.spawn(async move { bench.delete_ours(&id).await });
            }
            results.extend(set.join_all().await);
        }
        results.into_iter().collect()
    }

    /// Removes whatever the run left: through the daemon while it answers, then directly.
    pub async fn sweep(self: &Arc<Self>) {
        let host: Vec<String> = self
            .host_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        for id in host {
            let _ = Self::delete_on(&self.host_client, &self.host_live, &id).await;
        }
        let ours: Vec<String> = self
            .ours_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let _ = self.delete_ours_all(ours).await;
        let mut left: Vec<String> = self
            .ours_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        left.extend(
            self.raw_live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        if !left.is_empty() {
            eprintln!("  sweeping {} leftover machines", left.len());
            self.raw.remove_quietly(&left).await;
        }
    }
}
