// Package servetest reads event streams to their end for tests of the
// scheduler and of what drives it. It does not import serve, so serve's
// own tests may use it. Only tests import it.
package servetest
