package gateway

import "shoal/api/openai"

// specConstrainer is the front's Constrainer: the model's own, compiled
// here so that a bad grammar is a 400 before anything reaches the driver,
// whose constraints say what they were built from, which is what travels.
type specConstrainer struct{ openai.Constrainer }

func (c specConstrainer) Grammar(gbnf string, prefix []byte) (openai.Constraint, error) {
	inner, err := c.Constrainer.Grammar(gbnf, prefix)
	if err != nil {
		return nil, err
	}
	return specConstraint{Constraint: inner, spec: openai.ConstraintSpec{Grammar: gbnf, Prefix: append([]byte(nil), prefix...)}}, nil
}

// specConstraint is a compiled constraint with its spec.
type specConstraint struct {
	openai.Constraint
	spec openai.ConstraintSpec
}

func (c specConstraint) Spec() openai.ConstraintSpec { return c.spec }

// wireConstraint is the spec of c for the wire (nil for none).
func wireConstraint(c openai.Constraint) (*Constraint, bool) {
	if c == nil {
		return nil, true
	}
	s, ok := openai.SpecOf(c)
	if !ok {
		return nil, false
	}
	return &Constraint{Grammar: s.Grammar, Prefix: s.Prefix, Trigger: s.Trigger}, true
}

// spec is the openai spec of a wire constraint.
func (c *Constraint) spec() openai.ConstraintSpec {
	return openai.ConstraintSpec{Grammar: c.Grammar, Prefix: c.Prefix, Trigger: c.Trigger}
}
