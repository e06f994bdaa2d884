//! containerd's content store as the image pull uses it: blobs written under a lease with their
//! GC labels, labels added to blobs already there, and blobs read back verified.

use std::collections::HashMap;

use containerd_client::services::v1::{
    Info, InfoRequest, ReadContentRequest, UpdateRequest, WriteAction, WriteContentRequest,
};
use futures_util::StreamExt;
use narya_oci::Digest;

use super::client::{classify, is_not_found};
use super::{unique, Containerd};
use crate::{ErrorKind, Result, RuntimeError};

const WRITE_CHUNK: usize = 1 << 20;

impl Containerd {
    /// Whether the content store has `digest`; when it does, makes sure it carries `labels`.
    pub(super) async fn has_content(
        &self,
        digest: &Digest,
        labels: &HashMap<String, String>,
    ) -> Result<bool> {
        let info = match self
            .conn
            .content()
            .info(self.conn.request(InfoRequest {
                digest: digest.to_string(),
            }))
            .await
        {
            Ok(r) => r.into_inner().info,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(classify("reading content info", e)),
        };
        let Some(info) = info else { return Ok(false) };
        if labels.iter().all(|(k, v)| info.labels.get(k) == Some(v)) {
            return Ok(true);
        }
        self.conn
            .content()
            .update(self.conn.request(UpdateRequest {
                info: Some(Info {
                    digest: digest.to_string(),
                    labels: labels.clone(),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: labels.keys().map(|k| format!("labels.{k}")).collect(),
                }),
            }))
            .await
            .map_err(|e| classify("labelling content", e))?;
        Ok(true)
    }

    /// Writes `bytes` as `digest` through Content.Write's lock-step stream; containerd checks
    /// the digest on commit. A blob that appeared meanwhile is fine.
    pub(super) async fn write_content(
        &self,
        digest: &Digest,
        bytes: &[u8],
        labels: HashMap<String, String>,
        lease: &str,
    ) -> Result<()> {
        let reference = unique(&format!("narya-{}", digest.hex()));
        let total = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        let (tx, rx) = tokio::sync::mpsc::channel::<WriteContentRequest>(2);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let mut messages = Vec::new();
        let mut offset = 0usize;
        for chunk in bytes.chunks(WRITE_CHUNK) {
            messages.push(WriteContentRequest {
                action: WriteAction::Write as i32,
                r#ref: reference.clone(),
                total,
                expected: digest.to_string(),
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                data: chunk.to_vec(),
                labels: HashMap::new(),
            });
            offset += chunk.len();
        }
        messages.push(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: reference,
            total,
            expected: digest.to_string(),
            offset: total,
            data: Vec::new(),
            labels,
        });
        let mut messages = messages.into_iter();
        // The first message is queued before the call: containerd answers nothing until it
        // has one, and the call does not return until it answers.
        if let Some(first) = messages.next() {
            let _ = tx.send(first).await;
        }
        let mut responses = match self
            .conn
            .content()
            .write(self.conn.leased(stream, lease))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) if e.code() == tonic::Code::AlreadyExists => return Ok(()),
            Err(e) => return Err(classify(&format!("writing {digest}"), e)),
        };
        loop {
            match responses.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) if e.code() == tonic::Code::AlreadyExists => return Ok(()),
                Some(Err(e)) => return Err(classify(&format!("writing {digest}"), e)),
                None => break,
            }
            match messages.next() {
                Some(m) => {
                    if tx.send(m).await.is_err() {
                        break;
                    }
                }
                None => break,
            }
        }
        drop(tx);
        // Drain whatever is left so the stream ends cleanly.
        while let Some(r) = responses.next().await {
            if let Err(e) = r {
                if e.code() != tonic::Code::AlreadyExists {
                    return Err(classify(&format!("committing {digest}"), e));
                }
            }
        }
        Ok(())
    }

    /// Reads a whole blob from the content store, verified.
    pub(super) async fn read_content(&self, digest: &Digest) -> Result<Vec<u8>> {
        let mut stream = self
            .conn
            .content()
            .read(self.conn.request(ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: 0,
            }))
            .await
            .map_err(|e| classify(&format!("reading {digest}"), e))?
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| classify(&format!("reading {digest}"), e))?;
            bytes.extend_from_slice(&chunk.data);
        }
        if !digest.verifies(&bytes) {
            return Err(RuntimeError::plain(
                ErrorKind::Image,
                format!("content {digest} in containerd does not match its digest"),
            ));
        }
        Ok(bytes)
    }
}
