// Command attacker is the hostile node of the integration tests
// (TestAttacks in package integration, which builds it): it loads the
// certificate a node was issued (a client node's, or a removed node's)
// and the cluster's gossip key from that node's data dir, and attacks as
// that node would, printing what it got as JSON for the test to judge.
// Its subcommands:
//
//   - apply, remove, lead, state: the servers' cluster RPCs
//     (Cluster.Apply, Cluster.RemoveNode, Cluster.TransferLeader,
//     Cluster.State) over the node transport (QUIC, mutual TLS);
//   - model-bomb: a model-file report whose profile claims 2^40 experts,
//     bare and relaying an admin key; unknown-type: Cluster.Apply of a
//     command type no server knows (99, and 99|128);
//   - gossip: a member gossiped with the cluster's key under any node ID,
//     name, role and capacity, optionally with an endpoint of its own at
//     the gossiped QUIC port that counts the streams it receives (a Raft
//     stream above all) and asks servers for an HTTPS certificate;
//   - layout: Weights.Layout in tiny pieces; dist-open: many dist.open
//     sessions; streams: thousands of idle RPC streams on a few
//     connections;
//   - trickle: an HTTP request whose body comes a byte a second; http:
//     one HTTP request with a given key;
//   - join: a join stream with a chosen node name.
//
// It is built on the project's own transport and coordinator packages and
// hashicorp/memberlist; it is never shipped and never imported.
package main
