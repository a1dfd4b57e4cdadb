package parallel

import (
	"testing"
	"time"

	"shoal/placement"
)

// TestLingers: a replaced plan lingers while its successor loads and for
// LingerAfterLoad after; replaced again before that loaded, the oldest
// (which the driver still runs on) lingers on; LingerMax bounds it; a
// model unloaded ends it; a first plan or a plan without pools never
// lingers.
func TestLingers(t *testing.T) {
	pools := []placement.Pool{{}}
	plan := func(v uint64) *placement.Plan { return &placement.Plan{Version: v, Pools: pools} }
	var l Lingers
	t0 := time.Unix(1_000_000, 0)
	loaded := map[string]bool{}
	up := func(at time.Duration, plans map[string]*placement.Plan) map[string]*placement.Plan {
		return l.Update(t0.Add(at), plans, func(m string) bool { return loaded[m] })
	}
	want := func(got map[string]*placement.Plan, model string, v uint64) {
		t.Helper()
		if p := got[model]; v == 0 && p != nil || v != 0 && (p == nil || p.Version != v) {
			t.Fatalf("lingering %s: %+v, want v%d", model, p, v)
		}
	}
	want(up(0, map[string]*placement.Plan{"m": plan(1)}), "m", 0)
	want(up(time.Second, map[string]*placement.Plan{"m": plan(2)}), "m", 1)
	want(up(2*time.Second, map[string]*placement.Plan{"m": plan(3)}), "m", 1) // v2 never loaded
	loaded["m"] = true
	want(up(3*time.Second, map[string]*placement.Plan{"m": plan(3)}), "m", 1)
	want(up(3*time.Second+LingerAfterLoad, map[string]*placement.Plan{"m": plan(3)}), "m", 1)
	want(up(4*time.Second+LingerAfterLoad, map[string]*placement.Plan{"m": plan(3)}), "m", 0)

	loaded["m"] = false
	want(up(time.Minute, map[string]*placement.Plan{"m": plan(4)}), "m", 3)
	want(up(time.Minute+LingerMax, map[string]*placement.Plan{"m": plan(4)}), "m", 3)
	want(up(2*time.Minute+LingerMax, map[string]*placement.Plan{"m": plan(4)}), "m", 0)

	want(up(10*time.Minute, map[string]*placement.Plan{"m": plan(5)}), "m", 4)
	want(up(10*time.Minute, map[string]*placement.Plan{}), "m", 0) // unloaded
	want(up(11*time.Minute, map[string]*placement.Plan{"m": {Version: 6}}), "m", 0)
	want(up(12*time.Minute, map[string]*placement.Plan{"m": plan(7)}), "m", 0) // v6 had no pools
}
