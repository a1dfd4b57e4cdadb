package openai_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	oa "github.com/openai/openai-go/v3"
	sj "github.com/santhosh-tekuri/jsonschema/v6"
)

// personSchema is a strict schema whose every document is bounded (string
// lengths, integer range, array length), so that a random-weight model
// sampled at temperature 1 always finishes it within max_tokens.
const personSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "maxItems": 3},
    "member": {"type": "boolean"},
    "kind": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["a", "b"]}]},
    "score": {"type": "integer", "minimum": -50, "maximum": 50}
  },
  "required": ["name", "age", "tags", "member", "kind", "score"],
  "additionalProperties": false
}`

func referenceSchema(t testing.TB, schema string) *sj.Schema {
	t.Helper()
	doc, err := sj.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := sj.NewCompiler()
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem:///schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

func validDoc(sch *sj.Schema, doc string) error {
	inst, err := sj.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// TestClientJSONSchema: response_format json_schema (strict) through the
// official client: 100 completions sampled at temperature 1 (25 requests
// of n = 4, four at a time) all validate against the schema and end with
// finish_reason "stop"; the streamed form too; json_object gives JSON
// objects; the grammar extension constrains completions; bad schemas and
// grammars are 400s naming the field.
func TestClientJSONSchema(t *testing.T) {
	e := newEnv(t, envOptions{cacheTokens: 4096})
	c := newClient(e)
	ctx := context.Background()
	sch := referenceSchema(t, personSchema)
	format := oa.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &oa.ResponseFormatJSONSchemaParam{
		JSONSchema: oa.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Strict: oa.Bool(true), Schema: json.RawMessage(personSchema)}}}
	params := func(seed int64) oa.ChatCompletionNewParams {
		p := chatParams("Describe a person as JSON.", 400, 1)
		p.Seed = oa.Int(seed)
		p.N = oa.Int(4)
		p.ResponseFormat = format
		return p
	}
	var (
		mu      sync.Mutex
		invalid []string
		docs    int
		wg      sync.WaitGroup
		sem     = make(chan struct{}, 4)
	)
	for i := range 25 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res, err := c.Chat.Completions.New(ctx, params(int64(1000+4*i)))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				invalid = append(invalid, "request failed: "+err.Error()+" "+rawBody(err))
				return
			}
			for _, ch := range res.Choices {
				docs++
				if err := validDoc(sch, ch.Message.Content); err != nil || ch.FinishReason != "stop" {
					invalid = append(invalid, ch.Message.Content+" ("+ch.FinishReason+"): "+errString(err))
				}
			}
		}()
	}
	wg.Wait()
	if docs != 100 || len(invalid) > 0 {
		t.Fatalf("%d documents, %d invalid:\n%s", docs, len(invalid), strings.Join(invalid, "\n"))
	}

	// Streamed: the deltas add up to a valid document.
	p := params(7)
	p.N = oa.Int(1)
	st := c.Chat.Completions.NewStreaming(ctx, p)
	var text strings.Builder
	for st.Next() {
		for _, ch := range st.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if err := validDoc(sch, text.String()); err != nil {
		t.Fatalf("streamed document %q: %v", text.String(), err)
	}
	t.Logf("a streamed document: %s", text.String())

	// json_object: any JSON object.
	p = chatParams("Answer in JSON.", 300, 1)
	p.ResponseFormat = oa.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &oa.ResponseFormatJSONObjectParam{}}
	p.N = oa.Int(4)
	p.Seed = oa.Int(3)
	res, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range res.Choices {
		var obj map[string]any
		if ch.FinishReason == "stop" && json.Unmarshal([]byte(ch.Message.Content), &obj) != nil {
			t.Errorf("json_object answered %q, not a JSON object", ch.Message.Content)
		}
		if ch.FinishReason == "length" && !strings.HasPrefix(strings.TrimSpace(ch.Message.Content), "{") {
			t.Errorf("json_object answered %q (cut by max_tokens), not the start of an object", ch.Message.Content)
		}
	}

	// The grammar extension, on completions.
	resp := e.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "Pick:", "max_tokens": 20, "temperature": 1, "n": 8,
		"grammar": `root ::= ("yes" | "no" | "maybe") "!"`})
	var cr struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		}
	}
	cr.Choices = nil
	body := decodeBody[map[string]any](t, resp)
	b, _ := json.Marshal(body)
	if err := json.Unmarshal(b, &cr); err != nil || len(cr.Choices) != 8 {
		t.Fatalf("grammar completion: %v %s", err, b)
	}
	for _, ch := range cr.Choices {
		if ch.Text != "yes!" && ch.Text != "no!" && ch.Text != "maybe!" {
			t.Errorf("grammar completion %q, not one of yes!, no!, maybe!", ch.Text)
		}
	}

	for _, bad := range []struct {
		name, param, msg string
		body             map[string]any
	}{
		{"unsupported keyword", "response_format.json_schema.schema", "patternProperties",
			chatBody("x", map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x",
				"schema": map[string]any{"type": "object", "patternProperties": map[string]any{"^a": map[string]any{"type": "string"}}}}}})},
		{"no schema", "response_format.json_schema", "json_schema.schema",
			chatBody("x", map[string]any{"response_format": map[string]any{"type": "json_schema"}})},
		{"unknown format", "response_format", "not one of",
			chatBody("x", map[string]any{"response_format": map[string]any{"type": "yaml"}})},
		{"bad grammar", "grammar", "",
			chatBody("x", map[string]any{"grammar": `root ::= "a`})},
		{"undefined rule", "grammar", "",
			chatBody("x", map[string]any{"grammar": `root ::= thing`})},
		{"grammar and format", "grammar", "both",
			chatBody("x", map[string]any{"grammar": `root ::= "a"`, "response_format": map[string]any{"type": "json_object"}})},
	} {
		resp := e.post(t, "/v1/chat/completions", bad.body)
		checkError(t, resp, 400, bad.param, "", bad.msg)
	}
}

func errString(err error) string {
	if err == nil {
		return "valid"
	}
	var ve *sj.ValidationError
	if errors.As(err, &ve) {
		return ve.Error()
	}
	return err.Error()
}

func rawBody(err error) string {
	var ae *oa.Error
	if errors.As(err, &ae) {
		return ae.RawJSON()
	}
	return ""
}

// TestGrammarVocabularyCannotStart: a valid json_object request to a model
// whose vocabulary has no token that can begin an object ("{") is a 400
// that says so, not a 500 from the first step of generation.
func TestGrammarVocabularyCannotStart(t *testing.T) {
	e := newEnv(t, envOptions{noBrace: true})
	for _, body := range []map[string]any{
		chatBody("x", map[string]any{"response_format": map[string]any{"type": "json_object"}}),
		chatBody("x", map[string]any{"grammar": `root ::= "{" [a-z]* "}"`}),
	} {
		resp := e.post(t, "/v1/chat/completions", body)
		checkError(t, resp, 400, "", "", "vocabulary")
	}
	// A grammar the vocabulary can follow still works.
	resp := e.post(t, "/v1/chat/completions", chatBody("x", map[string]any{"grammar": `root ::= "yes" | "no"`, "max_tokens": 8}))
	if resp.StatusCode != 200 {
		t.Fatalf("a grammar the vocabulary can follow: %s", resp.Status)
	}
	resp.Body.Close()
}
