//! What containerd reports of Narya's machines: its event stream, with a process's own events
//! (an exec starting, ending) told apart from changes to the machine itself.

use super::Containerd;
use crate::{Change, Result};

/// What an event says changed: the machine it names, `None` when it is no change to a machine.
/// An exec's events (added, started, its exit, its deletion) are not, and dozens at once must
/// not each set off a look; nor are images, content, snapshots, leases or namespaces. A task's
/// own process has the container's id; an exec has its own. Every task event carries the
/// container's id as its first field, every container event its id.
fn machine_change(envelope: &containerd_client::types::Envelope) -> Option<Change> {
    use containerd_client::events::{ContainerDelete, TaskDelete, TaskExit, TaskOom};
    use prost::Message;
    let payload = envelope
        .event
        .as_ref()
        .map(|any| any.value.as_slice())
        .unwrap_or_default();
    let named = |id: String| {
        Some(if id.is_empty() {
            Change::Unknown
        } else {
            Change::Machine(id)
        })
    };
    let topic = envelope.topic.as_str();
    match topic {
        "/tasks/exec-added" | "/tasks/exec-started" => None,
        "/tasks/exit" => match TaskExit::decode(payload) {
            Ok(exit) if !exit.id.is_empty() && exit.id != exit.container_id => None,
            Ok(exit) => named(exit.container_id),
            Err(_) => Some(Change::Unknown),
        },
        "/tasks/delete" => match TaskDelete::decode(payload) {
            Ok(delete) if !delete.id.is_empty() && delete.id != delete.container_id => None,
            Ok(delete) => named(delete.container_id),
            Err(_) => Some(Change::Unknown),
        },
        // Any other task event (create, start, oom, paused, resumed, …): its first field.
        _ if topic.starts_with("/tasks/") => match TaskOom::decode(payload) {
            Ok(task) => named(task.container_id),
            Err(_) => Some(Change::Unknown),
        },
        _ if topic.starts_with("/containers/") => match ContainerDelete::decode(payload) {
            Ok(container) => named(container.id),
            Err(_) => Some(Change::Unknown),
        },
        _ if [
            "/images/",
            "/content/",
            "/snapshot/",
            "/namespaces/",
            "/leases/",
        ]
        .iter()
        .any(|prefix| topic.starts_with(prefix)) =>
        {
            None
        }
        _ => Some(Change::Unknown),
    }
}

impl Containerd {
    /// `Runtime::changes`.
    pub(super) async fn subscribe_changes(
        &self,
    ) -> Result<futures_util::stream::BoxStream<'static, Change>> {
        use futures_util::StreamExt;
        // containerd answers a subscription only with its first event, so the call is made in
        // a task of its own and its events relayed: the caller is never held up by a quiet
        // runtime. The relay ends with the subscription or when nobody listens any more.
        let (nudges, heard) = tokio::sync::mpsc::channel::<Change>(64);
        let conn = self.conn.clone();
        let request = containerd_client::services::v1::SubscribeRequest {
            // Events of every namespace arrive unless filtered.
            filters: vec![format!("namespace==\"{}\"", self.namespace)],
        };
        tokio::spawn(async move {
            let mut client = conn.events();
            let subscribed = tokio::select! {
                subscribed = client.subscribe(request) => subscribed,
                _ = nudges.closed() => return,
            };
            let Ok(events) = subscribed else { return };
            let mut events = events.into_inner();
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(envelope)) => {
                            let Some(change) = machine_change(&envelope) else {
                                continue;
                            };
                            if nudges.send(change).await.is_err() {
                                return;
                            }
                        }
                        _ => return,
                    },
                    _ = nudges.closed() => return,
                }
            }
        });
        Ok(futures_util::stream::unfold(heard, |mut heard| async move {
            heard.recv().await.map(|change| (change, heard))
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use containerd_client::events::{ContainerDelete, TaskExit};
    use containerd_client::types::Envelope;
    use prost::Message;

    use super::machine_change;
    use crate::Change;

    fn envelope(topic: &str, event: Option<Vec<u8>>) -> Envelope {
        Envelope {
            topic: topic.to_owned(),
            namespace: "narya".to_owned(),
            event: event.map(|value| prost_types::Any {
                type_url: "containerd.events.Any".to_owned(),
                value,
            }),
            ..Default::default()
        }
    }

    fn exit(container_id: &str, id: &str) -> Option<Vec<u8>> {
        Some(
            TaskExit {
                container_id: container_id.to_owned(),
                id: id.to_owned(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
    }

    fn machine(id: &str) -> Option<Change> {
        Some(Change::Machine(id.to_owned()))
    }

    #[test]
    fn an_execs_events_are_no_change_to_its_machine() {
        assert_eq!(machine_change(&envelope("/tasks/exec-added", None)), None);
        assert_eq!(machine_change(&envelope("/tasks/exec-started", None)), None);
        assert_eq!(
            machine_change(&envelope("/tasks/exit", exit("m", "exec-7"))),
            None
        );
    }

    #[test]
    fn a_machines_own_events_name_it() {
        assert_eq!(
            machine_change(&envelope("/tasks/exit", exit("m", "m"))),
            machine("m")
        );
        // Every task event has the container's id first, as an exit has.
        assert_eq!(
            machine_change(&envelope("/tasks/oom", exit("m", ""))),
            machine("m")
        );
        let deleted = ContainerDelete { id: "m".to_owned() };
        assert_eq!(
            machine_change(&envelope(
                "/containers/delete",
                Some(deleted.encode_to_vec())
            )),
            machine("m")
        );
    }

    #[test]
    fn images_content_and_snapshots_are_no_change_and_the_unknown_is_unknown() {
        for topic in ["/images/create", "/content/delete", "/snapshot/prepare"] {
            assert_eq!(machine_change(&envelope(topic, None)), None, "{topic}");
        }
        assert_eq!(
            machine_change(&envelope("/sandboxes/create", None)),
            Some(Change::Unknown)
        );
        assert_eq!(
            machine_change(&envelope("/tasks/start", None)),
            Some(Change::Unknown),
            "an event that names nobody"
        );
    }
}
