// Command attacker is the hostile node of the integration tests
// (TestAttacks in package integration, which builds it): it loads the
// certificate a client node was issued with an ordinary join token and
// calls the servers' cluster RPCs over the node transport (QUIC, mutual
// TLS) as that node, or makes one HTTP request with a given key, and
// prints what it got as JSON for the test to judge. It is never shipped
// and never imported.
package main
