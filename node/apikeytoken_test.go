package node_test

import (
	"strings"
	"testing"

	"shoal/node"
)

// An API key (ID.secret) given as --token to a node without an identity is
// refused at once: taken for a bootstrap secret it would derive a CA of its
// own and retry forever against servers that never trust it.
func TestAPIKeyIsNoJoinToken(t *testing.T) {
	for _, server := range []bool{false, true} {
		_, err := node.Start(ctx(t), node.Config{Name: "n", DataDir: t.TempDir(), Server: server, Bind: "127.0.0.1",
			Token: "abc123.0123456789abcdef", Join: []string{"127.0.0.1:1"}, Version: "test"})
		if err == nil || !strings.Contains(err.Error(), "--token abc123.… has the form of an API key") || strings.Contains(err.Error(), "0123456789abcdef") {
			t.Fatalf("server %v: %v", server, err)
		}
	}
}
