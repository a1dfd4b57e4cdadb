package api

import "testing"

// TestMeasuredOff: a prediction is called off beyond OffBy either way,
// and only on enough decode steps.
func TestMeasuredOff(t *testing.T) {
	for _, c := range []struct {
		pred, meas float64
		steps      uint64
		off        bool
	}{
		{1, 1.9, 100, false}, {1, 2.1, 100, true}, {1, 0.6, 100, false}, {1, 0.4, 100, true},
		{0.77, 52, 100, true}, {0.77, 52, 3, false}, {0, 52, 100, false}, {1, 0, 100, false},
	} {
		m := &Measured{PredictedMsPerToken: c.pred, MeasuredMsPerToken: c.meas, DecodeSteps: c.steps}
		if got := m.Off(); got != c.off {
			t.Errorf("predicted %v, measured %v over %d steps: Off %v, want %v", c.pred, c.meas, c.steps, got, c.off)
		}
	}
}
