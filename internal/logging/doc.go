// Package logging sets up shoal's zap logger once per process (level,
// console or JSON encoding). It must not import other shoal packages.
package logging
