package openai

import (
	"encoding/json"

	"go.uber.org/zap"
)

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

// NativeToolGrammar is the grammar of the calls of tools (a JSON array of
// Tool) in the format named format (toolFormat's names), all tools
// offered, several calls allowed, from the start (tool_choice required).
func NativeToolGrammar(format string, tools []byte, cons Constrainer) (string, error) {
	p := &toolPlan{choice: "required", parallel: true}
	for f := toolsGeneric; f <= toolsHarmony; f++ {
		if f.String() == format {
			p.format = f
		}
	}
	if err := json.Unmarshal(tools, &p.tools); err != nil {
		return "", err
	}
	gbnf, _, err := p.grammar(cons)
	return gbnf, err
}
