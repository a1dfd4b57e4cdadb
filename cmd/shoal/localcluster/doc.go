// Package localcluster starts a shoal cluster of agent processes on this
// machine's loopback interface (what `shoal up` runs): it writes the
// built-in model on first use, starts the agents with a shared secret,
// waits until they have formed a cluster and serve the model, and stops them
// all cleanly. It drives the shoal binary as a user would and must not reach
// into the agent's packages.
package localcluster
