package gateway

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"shoal/api/openai"
)

type oneRoute Route

func (r oneRoute) Route(model string) (Route, bool) { return Route(r), model == r.Model }
func (r oneRoute) Routes() []Route                  { return []Route{Route(r)} }

// TestForwardedToAMovedDriver: a request another agent passed on by a
// route older than this agent's (the driver moved away from here a moment
// ago, as each step of a rolling upgrade moves it) is refused with a 503
// to send again, not "the model does not exist" (404), which clients do
// not retry: the compose rolling upgrade saw that 404. A request that
// did not come over the transport is still sent on to the new driver.
func TestForwardedToAMovedDriver(t *testing.T) {
	f := NewForwarder(ForwarderConfig{Self: "n0", Local: func(string) bool { return false },
		Routes: oneRoute{Model: "m", Node: "n2", NodeName: "node-2", Ready: true, Status: "ready"}})
	ctx := context.WithValue(context.Background(), forwardedKey{}, forwardedReq{model: "m", from: "n1"})
	_, err := f.Backend(openai.NewStaticBackend()).Resolve(ctx, "m")
	var ref *openai.Refusal
	if !errors.As(err, &ref) || ref.Status != http.StatusServiceUnavailable || ref.Code != "model_moved" || ref.RetryAfter < 1 {
		t.Fatalf("a forwarded request for a model driven elsewhere now: %v", err)
	}
	if _, p := f.where(context.Background(), "m", false); p != drivenElsewhere {
		t.Errorf("a client's request: placement %d, want drivenElsewhere", p)
	}
}
