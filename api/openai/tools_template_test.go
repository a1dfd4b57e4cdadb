package openai

import (
	"encoding/json"
	"testing"
)

// TestTemplateTools checks the tools a chat template gets: each in the
// shape llama.cpp gives templates, {"type": "function", "function":
// {"name", "description", "parameters"}} in that order whatever the
// request's order, the description "" and the parameters {} when the
// request has none, other fields left out.
func TestTemplateTools(t *testing.T) {
	var req ChatRequest
	if err := json.Unmarshal([]byte(`{"tools": [
		{"function": {"parameters": {"type": "object", "properties": {"q": {"type": "string"}, "a": {"type": "integer"}}}, "name": "search", "description": "Search.", "strict": true}, "type": "function"},
		{"type": "function", "function": {"name": "noargs"}}]}`), &req); err != nil {
		t.Fatal(err)
	}
	p, e := readTools(&req)
	if e != nil {
		t.Fatal(e.msg)
	}
	want := []string{
		`{"type":"function","function":{"name":"search","description":"Search.","parameters":{"type":"object","properties":{"q":{"type":"string"},"a":{"type":"integer"}}}}}`,
		`{"type":"function","function":{"name":"noargs","description":"","parameters":{}}}`,
	}
	if len(p.raw) != len(want) {
		t.Fatalf("%d tools, want %d", len(p.raw), len(want))
	}
	for i, raw := range p.raw {
		if string(raw) != want[i] {
			t.Errorf("tools[%d] is\n%s\nwant\n%s", i, raw, want[i])
		}
	}
	// The grammar still sees an object schema for the tool without one.
	if got := string(p.tools[1].Function.Parameters); got != `{"type": "object", "properties": {}}` {
		t.Errorf("noargs parameters for the grammar: %s", got)
	}
}
