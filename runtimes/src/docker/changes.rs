//! A Docker machine's changes: the engine's container events of Narya machines.

use super::Docker;
use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::{Change, Result};

impl Docker {
    /// `Runtime::changes`: the engine's container events of Narya machines, from the moment
    /// of the call. The request goes out only when the stream is first read, so it asks for
    /// the events since now: a machine that stops in between is still reported.
    pub(super) async fn subscribe_changes(
        &self,
    ) -> Result<futures_util::stream::BoxStream<'static, Change>> {
        use futures_util::StreamExt;
        let client = self.engine.client().await?.clone();
        if self.engine.is_podman().await? {
            return Ok(super::podman::polled_changes(client).await);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let options = bollard::query_parameters::EventsOptions {
            since: Some(format!("{}.{:09}", now.as_secs(), now.subsec_nanos())),
            until: None,
            filters: Some(std::collections::HashMap::from([
                ("type".to_owned(), vec!["container".to_owned()]),
                ("label".to_owned(), vec![LABEL_ENVIRONMENT.to_owned()]),
                // What happens to machines; an exec's events (exec_create, exec_start,
                // exec_die) are not, and dozens at once must not each set off a pass.
                (
                    "event".to_owned(),
                    [
                        "create", "start", "die", "stop", "kill", "oom", "destroy", "pause",
                        "unpause",
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                ),
            ])),
        };
        Ok(client
            .events(Some(options))
            .take_while(|event| std::future::ready(event.is_ok()))
            .filter_map(|event| std::future::ready(event.ok().and_then(change_of)))
            .boxed())
    }
}

/// The machine an engine event is about, by the labels it carries as attributes; `None` for a
/// throwaway container's (which is no machine), `Unknown` when it names none.
fn change_of(event: bollard::models::EventMessage) -> Option<Change> {
    let attributes = event.actor.and_then(|a| a.attributes).unwrap_or_default();
    if labels::is_any_throwaway(&attributes) {
        return None;
    }
    Some(match labels::machine_name(&attributes) {
        Some(name) => Change::Machine(name.to_owned()),
        None => Change::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{EventActor, EventMessage};

    use super::change_of;
    use crate::Change;

    fn event(attributes: &[(&str, &str)]) -> EventMessage {
        EventMessage {
            actor: Some(EventActor {
                id: Some("f00d".to_owned()),
                attributes: Some(
                    attributes
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<HashMap<_, _>>(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_event_names_the_machine_by_its_labels_and_passes_over_throwaways() {
        let machine = event(&[
            ("name", "narya-1"),
            ("dev.narya.environment", "demo"),
            ("dev.narya.machine", "narya-1"),
        ]);
        assert_eq!(change_of(machine), Some(Change::Machine("narya-1".into())));
        let throwaway = event(&[
            ("name", "demo-clone"),
            ("dev.narya.throwaway", "demo-clone"),
        ]);
        assert_eq!(change_of(throwaway), None);
        assert_eq!(change_of(event(&[])), Some(Change::Unknown));
    }
}
