// Package api serves an agent's HTTP endpoints: the cluster admin API (the
// CLI's only way in), protected by API keys sent as "Authorization: Bearer".
// It talks to the Backend interface the node provides and never to Raft or
// gossip directly. Its wire types (Node, Token, ModelInfo, PlacementInfo,
// ...) are its own: it must not import coordinator or placement; the node
// converts the cluster state into them. Client is the matching Go client
// the CLI uses.
package api
