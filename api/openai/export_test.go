package openai

import "go.uber.org/zap"

// ChatPrompt renders and tokenizes msgs as a chat request for m does.
func ChatPrompt(m *Model, msgs []TemplateMessage) ([]int32, error) {
	ids, e := newHandler(NewStaticBackend(m), Options{Log: zap.NewNop()}).chatPrompt(m, msgs, nil)
	if e != nil {
		return nil, e
	}
	return ids, nil
}

// NewLazyConstraint is the constraint of a lazy grammar (tool_choice auto):
// free until trigger appears in the answer, then start's from there on.
func NewLazyConstraint(tok Tokenizer, trigger string, start func(prefix []byte) (Constraint, error)) Constraint {
	return &lazyConstraint{tok: tok, trigger: []byte(trigger), start: start}
}
