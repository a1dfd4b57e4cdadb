package node_test

import (
	"os"
	"testing"

	"go.uber.org/zap/zapcore"

	"shoal/internal/logging"
	tc "shoal/node/nodetest"
)

// SHOAL_TEST_LOG=info shows agent, raft and gossip logs; without it a
// failed cluster test prints its agents' last 3000 log lines at info.
func TestMain(m *testing.M) {
	if lvl := os.Getenv("SHOAL_TEST_LOG"); lvl != "" {
		if _, err := logging.Setup(logging.Options{Level: lvl}); err != nil {
			panic(err)
		}
	} else {
		tc.Logs = logging.NewRing(3000)
		logging.SetupRing(tc.Logs, zapcore.InfoLevel)
	}
	os.Exit(m.Run())
}
