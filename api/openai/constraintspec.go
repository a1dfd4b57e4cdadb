package openai

import "errors"

// A constraint is an object of the node that compiled it; to run a
// generation on another node (the gateway passes requests to a model's
// driver as tokens), what it was built from travels instead and the
// driver builds the same constraint from it with its own Constrainer.

// ConstraintSpec is what a constraint was built from: a GBNF grammar
// (start rule "root") advanced past Prefix, or, with Trigger set, an
// answer left free until the trigger text appears and held to Grammar
// from the trigger on.
type ConstraintSpec struct {
	Grammar string
	Prefix  []byte
	Trigger string
}

// SpecConstraint is a Constraint that can say what it was built from.
type SpecConstraint interface {
	Constraint
	Spec() ConstraintSpec
}

// SpecOf is the spec of c: ok is false when c cannot say (it was compiled
// by a Constrainer whose constraints are not SpecConstraints).
func SpecOf(c Constraint) (ConstraintSpec, bool) {
	if s, ok := c.(SpecConstraint); ok {
		return s.Spec(), true
	}
	return ConstraintSpec{}, false
}

// BuildConstraint builds the constraint spec describes with cons, for
// the vocabulary of tok: the one the endpoint would build for the same
// request. It is not advanced: the caller replays what was generated.
func BuildConstraint(cons Constrainer, tok Tokenizer, spec ConstraintSpec) (Constraint, error) {
	if cons == nil {
		return nil, errors.New("the model cannot constrain its output")
	}
	if spec.Trigger != "" {
		if len(spec.Prefix) > 0 {
			return nil, errors.New("a constraint with a trigger starts with no prefix")
		}
		return newLazyConstraint(cons, tok, spec.Grammar, spec.Trigger), nil
	}
	return cons.Grammar(spec.Grammar, spec.Prefix)
}

func newLazyConstraint(cons Constrainer, tok Tokenizer, gbnf, trigger string) *lazyConstraint {
	return &lazyConstraint{tok: tok, gbnf: gbnf, trigger: []byte(trigger), start: func(prefix []byte) (Constraint, error) {
		return cons.Grammar(gbnf, prefix)
	}}
}

// Spec implements SpecConstraint: the lazy constraint as it started (the
// caller replays the tokens that moved it on).
func (l *lazyConstraint) Spec() ConstraintSpec {
	return ConstraintSpec{Grammar: l.gbnf, Trigger: string(l.trigger)}
}
