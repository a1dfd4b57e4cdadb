// Package api serves an agent's HTTP endpoints: the cluster admin API (the
// CLI's only way in), protected by API keys sent as "Authorization: Bearer".
// It talks to the Backend interface the node provides and never to Raft or
// gossip directly. Client is the matching Go client the CLI uses.
package api
