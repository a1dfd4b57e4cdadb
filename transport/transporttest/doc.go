// Package transporttest opens endpoints on loopback for tests, with
// certificates from a certificate authority derived from a test secret.
// Only tests import it.
package transporttest
