package coordinator

import (
	"encoding/json"
	"fmt"

	"shoal/placement"
)

// The state stores placement.Plan itself. Before, a plan in the state (and
// in PlanSet log entries) was a wrapper: version, model, a mirror of the
// pools in the cluster's own types and predicted_ms_per_token beside the
// planner's plan under "placement", with moved, moved_bytes and created_at.
// Snapshots and log entries of that shape still decode: the plan under
// "placement" is taken with the wrapper's version, model and moves (the
// mirror and created_at are dropped); a wrapper without "placement", which
// every reader treated as no placement, becomes a plan without pools.

// decodePlan decodes a plan of either shape; nil for JSON null.
func decodePlan(b []byte) (*placement.Plan, error) {
	var v *struct {
		placement.Plan
		Legacy    *placement.Plan `json:"placement"`
		Predicted *float64        `json:"predicted_ms_per_token"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v == nil {
		return nil, err
	}
	switch {
	case v.Legacy != nil:
		p := *v.Legacy
		p.Version, p.Model, p.Moved, p.MovedBytes = v.Version, v.Model, v.Moved, v.MovedBytes
		return &p, nil
	case v.Predicted != nil:
		return &placement.Plan{Version: v.Version, Model: v.Model, Moved: v.Moved, MovedBytes: v.MovedBytes}, nil
	}
	return &v.Plan, nil
}

// UnmarshalJSON decodes a state, its plans of either shape.
func (s *State) UnmarshalJSON(b []byte) error {
	type plain State // without this method
	aux := struct {
		*plain
		Plans map[string]json.RawMessage `json:"plans"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	s.Plans = make(map[string]*placement.Plan, len(aux.Plans))
	for name, raw := range aux.Plans {
		p, err := decodePlan(raw)
		if err != nil {
			return fmt.Errorf("plan of %q: %w", name, err)
		}
		if p != nil {
			s.Plans[name] = p
		}
	}
	return nil
}

// UnmarshalJSON decodes a PlanSet command, its plan of either shape.
func (r *PlanSetRequest) UnmarshalJSON(b []byte) error {
	var aux struct {
		Plan   json.RawMessage `json:"plan"`
		Inputs string          `json:"inputs"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*r = PlanSetRequest{Inputs: aux.Inputs}
	if len(aux.Plan) == 0 {
		return nil
	}
	p, err := decodePlan(aux.Plan)
	if p != nil {
		r.Plan = *p
	}
	return err
}
