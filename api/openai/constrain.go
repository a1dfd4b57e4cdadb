package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The constraints a request can put on its output: a GBNF grammar
// (grammar, llama-server's extension), any JSON object
// (response_format json_object) or a JSON document valid against a schema
// (response_format json_schema, or json_object with a schema). The model's
// Constrainer compiles them; each choice gets its own state.

// maxGrammarBytes bounds a request's grammar or schema text.
const maxGrammarBytes = 256 << 10

// responseFormat reads a chat request's response_format into the grammar
// it asks for ("" for text).
func (r *genRequest) responseFormat(rf *ResponseFormat) *apiError {
	if rf == nil {
		return nil
	}
	switch rf.Type {
	case "", "text":
		return nil
	case "json_object":
		if len(rf.Schema) > 0 && !bytes.Equal(bytes.TrimSpace(rf.Schema), []byte("null")) {
			return r.schemaGrammar("response_format.schema", rf.Schema)
		}
		cons, e := r.constrainer("response_format")
		if e != nil {
			return e
		}
		r.grammar, r.grammarParam = cons.AnyObject(), "response_format"
		return nil
	case "json_schema":
		js := rf.JSONSchema
		if js == nil || len(bytes.TrimSpace(js.Schema)) == 0 {
			return badRequest("response_format.json_schema", "response_format json_schema needs json_schema.schema (a JSON Schema object)")
		}
		return r.schemaGrammar("response_format.json_schema.schema", js.Schema)
	}
	return badRequest("response_format", "response_format type %q is not one of text, json_object, json_schema", rf.Type)
}

// constrainer is the model's, or the error of a model without one.
func (r *genRequest) constrainer(param string) (Constrainer, *apiError) {
	if r.model.Constrainer == nil {
		return nil, badRequest(param, "model %q cannot constrain its output (grammars, JSON schemas and tool calls are not available for it)", r.model.Name)
	}
	return r.model.Constrainer, nil
}

// schemaGrammar sets the grammar of the documents valid against schema.
func (r *genRequest) schemaGrammar(param string, schema json.RawMessage) *apiError {
	cons, e := r.constrainer(param)
	if e != nil {
		return e
	}
	if len(schema) > maxGrammarBytes {
		return badRequest(param, "the schema is %d bytes; at most %d are allowed", len(schema), maxGrammarBytes)
	}
	rules, root, err := cons.SchemaRules(schema, "doc-")
	if err != nil {
		return badRequest(param, "%v", err)
	}
	r.grammar, r.grammarParam = fmt.Sprintf("root ::= %s\n%s", root, rules), param
	return nil
}

// compileGrammar compiles the request's grammar once, to answer a bad one
// with 400 before anything is generated; every choice then starts its own
// state (the Constrainer caches what it compiled).
func (r *genRequest) compileGrammar() *apiError {
	if r.grammar == "" {
		return nil
	}
	cons, e := r.constrainer(r.grammarParam)
	if e != nil {
		return e
	}
	if len(r.grammar) > maxGrammarBytes {
		return badRequest(r.grammarParam, "the grammar is %d bytes; at most %d are allowed", len(r.grammar), maxGrammarBytes)
	}
	first, err := cons.Grammar(r.grammar, nil)
	if err != nil {
		return badRequest(r.grammarParam, "%v", err)
	}
	if r.trigger == "" && first != nil && !first.Done() && noTokenAllowed(first.Mask()) {
		// The answer could not take its first step: a vocabulary too small
		// for the grammar (one without "{" for a JSON object).
		return badRequest(r.grammarParam, "model %q's vocabulary has no token that can begin what the %s allows (for JSON, a token that starts with \"{\" or whitespace)", r.model.Name, r.grammarParam)
	}
	gbnf, param, trigger, tok := r.grammar, r.grammarParam, r.trigger, r.model.Tokenizer
	r.constrain = func() (Constraint, *apiError) {
		if trigger != "" {
			return newLazyConstraint(cons, tok, gbnf, trigger), nil
		}
		if first != nil {
			c := first
			first = nil
			return c, nil
		}
		c, err := cons.Grammar(gbnf, nil)
		if err != nil {
			return nil, badRequest(param, "%v", err)
		}
		return c, nil
	}
	return nil
}

// lazyConstraint leaves an answer free until the trigger text appears in
// it (a tool call's start, when the model may also answer in text), then
// holds it to the grammar from the trigger on.
type lazyConstraint struct {
	tok     Tokenizer
	gbnf    string // the grammar from the trigger on (for Spec)
	trigger []byte
	start   func(prefix []byte) (Constraint, error)
	text    []byte // the answer so far (its tail, before the trigger)
	inner   Constraint
}

func (l *lazyConstraint) Mask() []uint64 {
	if l.inner == nil {
		return nil
	}
	return l.inner.Mask()
}

func (l *lazyConstraint) Accept(tok int32) error {
	if l.inner != nil {
		return l.inner.Accept(tok)
	}
	l.text = append(l.text, l.tok.Piece(tok)...)
	if i := bytes.Index(l.text, l.trigger); i >= 0 {
		c, err := l.start(l.text[i:])
		if err != nil {
			return err
		}
		l.inner, l.text = c, nil
		return nil
	}
	// Only a tail shorter than the trigger can still start it.
	if keep := len(l.trigger) - 1; len(l.text) > keep {
		l.text = append(l.text[:0], l.text[len(l.text)-keep:]...)
	}
	return nil
}

func (l *lazyConstraint) Done() bool { return l.inner != nil && l.inner.Done() }

// noTokenAllowed reports whether a constraint's mask allows no token at
// all (nil allows every token).
func noTokenAllowed(mask []uint64) bool {
	if mask == nil {
		return false
	}
	for _, w := range mask {
		if w != 0 {
			return false
		}
	}
	return true
}
