// Package integration starts shoal agents as separate processes in network
// namespaces joined by veth links to a bridge, and drives them with the
// CLI, as an operator would. It needs root (ip netns); run it with `make
// test-integration`. Its tests are behind the integration build tag; it
// must not import the agent's packages: attacker/ is the hostile node
// TestAttacks builds and runs as a process of its own, and the only code
// here that speaks the node transport.
package integration
