//! Which MariaDB Galera nodes an election group's replicas are connected
//! to. Each daemon's presence row carries its node in the row's address
//! column (a presence row has no other use for it; the node it was on when
//! it took the row), and every daemon warns when the group's live replicas
//! sit on more than one node: a fenced
//! transaction then no longer holds a takeover off, and a node's failure
//! stops its replicas' renewals while the cluster reconfigures
//! (docs/databases.md, "Galera clusters").

use std::collections::BTreeSet;

use leaderd_store::ElectionRow;
use tracing::warn;

/// The nodes of this daemon (`own`) and of the group's live presence
/// rows; a row without a node (an earlier version, another backend) is
/// not counted.
pub fn nodes_of<'a>(
    own: Option<&'a str>,
    live: impl IntoIterator<Item = &'a ElectionRow>,
) -> BTreeSet<&'a str> {
    own.into_iter()
        .chain(live.into_iter().filter_map(|row| row.address.as_deref()))
        .collect()
}

/// Warns when the group is seen spread over nodes, and again only when a
/// node it did not name before joins: replicas replaced one by one (a
/// rolling update) leave and join the same nodes, and are not news.
#[derive(Debug, Default)]
pub struct Nodes {
    named: BTreeSet<String>,
}

impl Nodes {
    /// Looks at one read of the group's presence rows; whether it warned.
    pub fn see<'a>(
        &mut self,
        own: Option<&'a str>,
        live: impl IntoIterator<Item = &'a ElectionRow>,
    ) -> bool {
        let nodes = nodes_of(own, live);
        if nodes.len() < 2 || nodes.iter().all(|n| self.named.contains(*n)) {
            return false;
        }
        self.named.extend(nodes.iter().map(|n| (*n).to_owned()));
        let nodes: Vec<&str> = nodes.into_iter().collect();
        warn!(
            nodes = %nodes.join(", "),
            "the replicas of this election are connected to different Galera nodes: a fenced \
             transaction on one node no longer holds off a takeover from another (its COMMIT \
             fails with error 1213 instead), and a node's failure leaves no leader for about \
             6 s while the cluster reconfigures; keep every daemon and fenced app on one node, \
             through a single-writer proxy (docs/databases.md, \"Galera clusters\")"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(node: Option<&str>) -> ElectionRow {
        ElectionRow {
            name: "leaderd-presence/x/slot-0".into(),
            holder: Some("a".into()),
            token: 1,
            remaining_us: 1_000_000,
            instance: Some("i".into()),
            held_us: 0,
            address: node.map(String::from),
            successor: None,
        }
    }

    #[test]
    fn replicas_without_a_node_or_on_ones_node_are_no_spread() {
        let rows = [row(Some("n1")), row(None), row(Some("n1"))];
        assert_eq!(nodes_of(Some("n1"), &rows).len(), 1);
        assert_eq!(nodes_of(None, &[row(None)]).len(), 0);
        let mut nodes = Nodes::default();
        assert!(!nodes.see(Some("n1"), &rows));
    }

    #[test]
    fn a_spread_is_warned_of_once_and_again_only_for_a_new_node() {
        let mut nodes = Nodes::default();
        let spread = [row(Some("n2")), row(Some("n1"))];
        assert!(nodes.see(Some("n1"), &spread));
        assert!(!nodes.see(Some("n1"), &spread), "warned twice");
        // A replica replaced on the same node: gone, then back.
        assert!(!nodes.see(Some("n1"), &[row(Some("n1"))]));
        assert!(!nodes.see(Some("n1"), &spread));
        // A third node is news.
        assert!(nodes.see(Some("n1"), &[row(Some("n2")), row(Some("n3"))]));
        assert!(!nodes.see(Some("n1"), &[row(Some("n3"))]));
        // Another daemon's view, which does not know its own node yet.
        assert!(Nodes::default().see(None, &spread));
    }
}
