package openai

import "go.uber.org/zap"

// ChatPrompt renders and tokenizes msgs as a chat request for m does.
func ChatPrompt(m *Model, msgs []TemplateMessage) ([]int32, error) {
	ids, e := newHandler(NewStaticBackend(m), Options{Log: zap.NewNop()}).chatPrompt(m, msgs)
	if e != nil {
		return nil, e
	}
	return ids, nil
}
