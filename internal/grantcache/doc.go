// Package grantcache keeps an authority's yes for a while: a client agent
// asks a server whether an API key has a scope, and keeps the answer so
// that a stream of requests costs one round trip per key and Fresh, and so
// that while no server answers, a yes of the last Stale still stands. A
// no is never kept. Keys are kept as their SHA-256, never in the clear.
package grantcache
