// Package identity is a node's identity in the cluster: its ID (the data
// dir's node-id), its QUIC certificate and the gossip key (the data dir's
// tls/ folder), got by joining with a join token or by the bootstrap
// servers' sealed exchange of the cluster CA and gossip key; the join
// handler servers run (tokens, impostors and names checked, certificates
// issued by the leader); and the HTTPS certificate of the agent's API
// (the operator's, or one the cluster's HTTPS CA signs, renewed before it
// expires). It must not import node: what it needs of the agent arrives
// in Config, AdmissionConfig and Signer as values and funcs. It issues and
// checks identities only; what a node may do once admitted (API scopes,
// placement) is node's and coordinator's.
package identity
