//! What containerd reports of Narya's machines: its event stream, with a process's own events
//! (an exec starting, ending) told apart from changes to the machine itself.

use super::Containerd;
use crate::Result;

/// Whether an event is a change to a machine rather than to one of its processes: an exec's
/// events (added, started, its exit, its deletion) are not, and dozens at once must not each
/// set off a pass. A task's own process has the container's id; an exec has its own.
fn is_machine_change(envelope: &containerd_client::types::Envelope) -> bool {
    use containerd_client::events::{TaskDelete, TaskExit};
    use prost::Message;
    let payload = envelope.event.as_ref().map(|any| any.value.as_slice());
    match envelope.topic.as_str() {
        "/tasks/exec-added" | "/tasks/exec-started" => false,
        "/tasks/exit" => payload
            .and_then(|bytes| TaskExit::decode(bytes).ok())
            .is_none_or(|exit| exit.id.is_empty() || exit.id == exit.container_id),
        "/tasks/delete" => payload
            .and_then(|bytes| TaskDelete::decode(bytes).ok())
            .is_none_or(|delete| delete.id.is_empty() || delete.id == delete.container_id),
        _ => true,
    }
}

impl Containerd {
    /// `Runtime::changes`.
    pub(super) async fn subscribe_changes(
        &self,
    ) -> Result<futures_util::stream::BoxStream<'static, ()>> {
        use futures_util::StreamExt;
        // containerd answers a subscription only with its first event, so the call is made in
        // a task of its own and its events relayed: the caller is never held up by a quiet
        // runtime. The relay ends with the subscription or when nobody listens any more.
        let (nudges, heard) = tokio::sync::mpsc::channel::<()>(16);
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
                            if !is_machine_change(&envelope) {
                                continue;
                            }
                            if nudges.send(()).await.is_err() {
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
            heard.recv().await.map(|()| ((), heard))
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use containerd_client::events::TaskExit;
    use containerd_client::types::Envelope;
    use prost::Message;

    use super::is_machine_change;

    fn envelope(topic: &str, event: Option<TaskExit>) -> Envelope {
        Envelope {
            topic: topic.to_owned(),
            namespace: "narya".to_owned(),
            event: event.map(|e| prost_types::Any {
                type_url: "containerd.events.TaskExit".to_owned(),
                value: e.encode_to_vec(),
            }),
            ..Default::default()
        }
    }

    fn exit(container_id: &str, id: &str) -> Option<TaskExit> {
        Some(TaskExit {
            container_id: container_id.to_owned(),
            id: id.to_owned(),
            ..Default::default()
        })
    }

    #[test]
    fn an_execs_events_are_no_change_to_its_machine() {
        assert!(!is_machine_change(&envelope("/tasks/exec-added", None)));
        assert!(!is_machine_change(&envelope("/tasks/exec-started", None)));
        assert!(!is_machine_change(&envelope(
            "/tasks/exit",
            exit("m", "exec-7")
        )));
    }

    #[test]
    fn a_machines_own_exit_and_removal_are_changes() {
        assert!(is_machine_change(&envelope("/tasks/exit", exit("m", "m"))));
        assert!(is_machine_change(&envelope("/containers/delete", None)));
        assert!(is_machine_change(&envelope("/tasks/oom", None)));
    }
}
