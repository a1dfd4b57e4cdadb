package node_test

import (
	"os"
	"testing"

	"shoal/internal/logging"
)

// SHOAL_TEST_LOG=info shows agent, raft and gossip logs.
func TestMain(m *testing.M) {
	if lvl := os.Getenv("SHOAL_TEST_LOG"); lvl != "" {
		if _, err := logging.Setup(logging.Options{Level: lvl}); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
