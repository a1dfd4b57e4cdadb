// Package nodetest starts shoal agents in-process on free loopback ports
// with short timers, for tests of the control plane and of what the agent
// wires together (the API, serving, forwarding). Only tests import it; it
// must not hold product logic.
package nodetest
