//! The OCI image-spec documents Narya reads and writes: descriptors, index, manifest, config.
//! Docker's v2 schema-2 media types are accepted on read, as registries serve both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Digest;

pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_TYPE_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_TYPE_DOCKER_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_TYPE_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const MEDIA_TYPE_DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// Whether `media_type` names an image index (OCI) or manifest list (Docker).
pub fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_TYPE_OCI_INDEX || media_type == MEDIA_TYPE_DOCKER_LIST
}

/// Whether `media_type` names an image manifest (OCI or Docker schema 2).
pub fn is_manifest(media_type: &str) -> bool {
    media_type == MEDIA_TYPE_OCI_MANIFEST || media_type == MEDIA_TYPE_DOCKER_MANIFEST
}

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image index (or Docker manifest list); `index.json` of a layout is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The parts of an image configuration Narya uses; unknown fields are kept out of our way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub config: ContainerConfig,
    pub rootfs: RootFs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerConfig {
    #[serde(rename = "User", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(rename = "Env", default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(
        rename = "Entrypoint",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub working_dir: Option<String>,
    #[serde(rename = "Labels", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// Picks the linux/amd64 manifest from an index: the only manifest when there is one without
/// a platform, else the one whose platform is linux/amd64.
pub fn select_linux_amd64(index: &ImageIndex) -> Option<&Descriptor> {
    let candidates: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| is_manifest(&d.media_type) || is_index(&d.media_type))
        .collect();
    if let Some(d) = candidates.iter().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    }) {
        return Some(d);
    }
    match candidates.as_slice() {
        [only] if only.platform.is_none() => Some(only),
        _ => None,
    }
}

/// The chain ids of a layer stack: `chain[0] = diff[0]`,
/// `chain[i] = sha256(chain[i-1] + " " + diff[i])`.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_image_spec() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of(format!("{a} {b}").as_bytes()));
    }

    #[test]
    fn linux_amd64_is_picked_from_an_index() {
        let d = |arch: &str| Descriptor {
            media_type: MEDIA_TYPE_OCI_MANIFEST.to_owned(),
            digest: Digest::of(arch.as_bytes()),
            size: 1,
            platform: Some(Platform {
                architecture: arch.to_owned(),
                os: "linux".to_owned(),
                variant: None,
            }),
            annotations: BTreeMap::new(),
        };
        let index = ImageIndex {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_OCI_INDEX.to_owned()),
            manifests: vec![d("arm64"), d("amd64")],
            annotations: BTreeMap::new(),
        };
        assert_eq!(
            select_linux_amd64(&index).unwrap().digest,
            Digest::of(b"amd64")
        );
        let only_arm = ImageIndex {
            manifests: vec![d("arm64")],
            ..index
        };
        assert!(select_linux_amd64(&only_arm).is_none());
    }
}
