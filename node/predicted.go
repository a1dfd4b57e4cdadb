package node

import (
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/parallel"
	"shoal/placement"
	"shoal/serve"
)

// planPrediction is the version of model's plan in this agent's copy of
// the state, and its predicted decode step of one sequence on the nodes'
// and links' figures now (coordinator.DecodePrediction).
func (a *Agent) planPrediction(model string) (version uint64, predicted float64, ok bool) {
	a.viewState(func(st *coordinator.State) {
		version, predicted, ok = coordinator.DecodePrediction(st, model)
	})
	return
}

// prefillPrediction is model's plan's predicted prefill of a prompt of n
// tokens in this agent's copy of the state (coordinator.PrefillPrediction).
func (a *Agent) prefillPrediction(model string, n int) (ms float64, ok bool) {
	a.viewState(func(st *coordinator.State) {
		var pf placement.Prefill
		_, pf, ok = coordinator.PrefillPrediction(st, model, n)
		ms = pf.Ms
	})
	return
}

// predictionLoop checks, every 30 s, the decode time each model driven
// here measures against its plan's prediction, and logs a warning once per
// plan version when they are more than api.OffBy apart: the planner
// weighed the nodes on figures that do not hold (placement show prints
// both).
func (a *Agent) predictionLoop() {
	defer a.bg.Done()
	warned := map[string]uint64{} // model: the plan version warned of
	for {
		select {
		case <-a.done:
			return
		case <-time.After(30 * time.Second):
		}
		a.pub.each(func(name string, sc *serve.Scheduler, _ *parallel.Engine) {
			version, predicted, ok := a.planPrediction(name)
			if !ok || warned[name] == version {
				return
			}
			st := sc.Stats()
			m := &api.Measured{Model: name, PlanVersion: version, PredictedMsPerToken: predicted, MeasuredMsPerToken: st.DecodeMs, DecodeSteps: st.DecodeSteps}
			if m.Off() {
				warned[name] = version
				a.log.Warn("the plan's predicted decode time is off: the planner weighed figures that do not hold here (see 'shoal placement show')",
					zap.String("model", name), zap.Uint64("plan", version), zap.Float64("predicted_ms_per_token", predicted),
					zap.Float64("measured_ms_per_token", st.DecodeMs), zap.Uint64("decode_steps", st.DecodeSteps))
			}
		})
	}
}
