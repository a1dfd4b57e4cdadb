package node

import (
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestStartingAgentAnswers503: an agent that has not applied a state yet
// does not know the cluster's models, so the gateway is told a model is
// "starting" (503 with Retry-After, which clients retry) rather than that
// it does not exist (404, which they do not: a compose rolling upgrade
// saw it on the node behind the published port in the second after its
// restart); its readiness says "starting" too.
func TestStartingAgentAnswers503(t *testing.T) {
	a := &Agent{log: zap.NewNop()}
	a.life.joined.Store(true)
	a.life.registered.Store(true)
	if status, known := a.unserved("m"); !known || !strings.HasPrefix(status, "starting") {
		t.Fatalf("before the first state: %q %v", status, known)
	}
	if a.IsReady() || a.notReadyReason() != "starting" {
		t.Errorf("ready %v (%s) before the first state", a.IsReady(), a.notReadyReason())
	}
}
