//! The last membership a member saw, kept on disk.
//!
//! A daemon started while etcd cannot be reached knew nothing of its group and served as
//! a group of one: it acknowledged Puts on itself alone, which the other members, routing
//! by the full membership, never asked it for (black-box finding: 44-46 of 100 blocks put
//! through a member restarted during an etcd outage missed through every other member
//! once etcd was back). The member writes each membership etcd gives it to a file in its
//! cache dir (atomically: a temporary file renamed over the last one) and, at a start,
//! begins from that file: the last membership it saw, as one that stayed up keeps it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::membership::{GroupConfig, Membership, NodeId, NodeInfo};

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// The group's key prefix (`/<prefix>/<group>/nodes/`): a file another group left
    /// in the cache dir is not this group's membership.
    group: String,
    nodes: Vec<NodeInfo>,
    #[serde(default)]
    created: BTreeMap<NodeId, i64>,
}

/// The membership saved at `path` for `cfg`'s group, as this node starts from it: not
/// connected, revision 0, this node's record `me` in it (its capacity or address may
/// have changed since) and no other record at `me`'s address (this node under an id it
/// had before). None when there is no file, or it is unreadable or another group's.
pub(crate) fn load(path: &Path, cfg: &GroupConfig, me: &NodeInfo) -> Option<Membership> {
    // Not a regular file (a fifo would block the start): unreadable.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        tracing::warn!(path = %path.display(), "the last membership is not a regular file; ignored");
        return None;
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the last membership could not be read");
            return None;
        }
    };
    let saved: Saved = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable last membership");
            return None;
        }
    };
    if saved.group != cfg.nodes_prefix() {
        tracing::info!(path = %path.display(), saved = %saved.group, group = %cfg.nodes_prefix(),
            "ignoring the last membership of another group");
        return None;
    }
    let mut m = Membership::default();
    for n in saved.nodes {
        if n.id == me.id || (!me.advertise.is_empty() && n.advertise == me.advertise) {
            continue;
        }
        if let Some(c) = saved.created.get(&n.id) {
            m.created.insert(n.id.clone(), *c);
        }
        m.nodes.insert(n.id.clone(), n);
    }
    // Unknown until etcd answers; this node is live at its address, so it wins any tie.
    m.created.insert(me.id.clone(), i64::MAX);
    m.nodes.insert(me.id.clone(), me.clone());
    Some(m)
}

/// Writes `m` as `cfg`'s last membership at `path`: to a temporary file beside it,
/// synced, then renamed over it, so a crash leaves the old file or the new one.
pub(crate) fn save(path: &Path, cfg: &GroupConfig, m: &Membership) -> std::io::Result<()> {
    let saved = Saved {
        group: cfg.nodes_prefix(),
        nodes: m.nodes.values().cloned().collect(),
        created: m.created.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
    let tmp = tmp_path(path);
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, addr: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId::new(id),
            advertise: addr.into(),
            capacity: BTreeMap::from([("memory".into(), 1 << 30)]),
            zone: String::new(),
            admin: String::new(),
        }
    }

    #[test]
    fn a_saved_membership_loads_with_this_node_current_and_its_old_ids_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster-membership.json");
        let cfg = GroupConfig::new(vec!["http://127.0.0.1:1".into()], "g");
        let mut m = Membership::default();
        for (id, addr, rev) in [("a", "a:1", 5), ("b", "b:1", 6), ("old-c", "c:1", 7)] {
            m.nodes.insert(NodeId::new(id), info(id, addr));
            m.created.insert(NodeId::new(id), rev);
        }
        save(&path, &cfg, &m).expect("save");
        let me = info("c", "c:1");
        let got = load(&path, &cfg, &me).expect("loaded");
        assert_eq!(
            got.ids(),
            vec![NodeId::new("a"), NodeId::new("b"), NodeId::new("c")]
        );
        assert!(!got.connected);
        assert_eq!(got.revision, 0);
        assert_eq!(got.created[&NodeId::new("a")], 5);
        assert_eq!(got.nodes[&NodeId::new("c")], me);

        // Another group's file, or none, gives nothing.
        let other = GroupConfig::new(vec!["http://127.0.0.1:1".into()], "h");
        assert!(load(&path, &other, &me).is_none());
        assert!(load(&dir.path().join("absent"), &cfg, &me).is_none());
        std::fs::write(&path, b"{not json").expect("write");
        assert!(load(&path, &cfg, &me).is_none());
    }
}
