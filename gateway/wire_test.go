package gateway

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzParseRequest: any frame parses to a request that passes its checks
// or to an error, never a panic; a request that parses survives its own
// encoding unchanged.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"op":"generate","model":"x","prompt":[1,2,3],"generated":[4],"max_tokens":8,"sampling":{"Temperature":0.7,"Seed":9},"logprobs":true,"top_logprobs":3}`,
		`{"v":1,"op":"generate","model":"x","prompt":[1],"constraint":{"grammar":"root ::= \"a\"","prefix":"YQ==","trigger":"<tool>"}}`,
		`{"v":1,"op":"vocab","model":"x"}`,
		`{"v":1,"op":"generate","model":"x","prompt":[-1]}`,
		`{"v":1,"op":"generate","model":"x","prompt":[1],"max_tokens":1,"generated":[2]}`,
		`{"v":2}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		if r.check() != nil {
			t.Fatal("a parsed request fails its checks")
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", r, err)
		}
		r2, err := ParseRequest(again)
		if err != nil {
			t.Fatalf("the re-encoded request does not parse: %v", err)
		}
		if !reflect.DeepEqual(normal(r), normal(r2)) {
			t.Fatalf("the request changed through its encoding:\n%+v\n%+v", r, r2)
		}
	})
}

// normal makes empty and nil slices alike (JSON does not tell them apart).
func normal(r Request) Request {
	if len(r.Prompt) == 0 {
		r.Prompt = nil
	}
	if len(r.Generated) == 0 {
		r.Generated = nil
	}
	if c := r.Constraint; c != nil && len(c.Prefix) == 0 {
		cc := *c
		cc.Prefix = nil
		r.Constraint = &cc
	}
	return r
}
