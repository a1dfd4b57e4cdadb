package gateway

import (
	"container/list"
	"fmt"
	"sync"

	"shoal/api/openai"
	"shoal/engine/sample/grammar"
	"shoal/engine/sample/jsonschema"
	"shoal/engine/tokenizer"
)

// maxCompiledGrammars bounds the grammars a model keeps compiled (with
// their mask caches) for the requests that come back with the same one.
// Each mask cache may grow to 64 MiB (engine/sample/grammar), so this also
// bounds what clients sending many different schemas can make a model
// hold: 8 x 64 MiB.
const maxCompiledGrammars = 8

// constrainer compiles the endpoint's grammars and JSON schemas for one
// model's vocabulary (openai.Constrainer): the token trie is built once,
// on the first constrained request, and compiled grammars are kept (least
// recently used out) so that requests with the same schema share their
// masks.
type constrainer struct {
	tok *tokenizer.Tokenizer

	once  sync.Once
	vocab *grammar.Vocab

	mu    sync.Mutex
	bySrc map[string]*list.Element // of *compiled
	lru   *list.List
}

type compiled struct {
	src string
	c   *grammar.Constraint
}

func newConstrainer(tok *tokenizer.Tokenizer) *constrainer {
	return &constrainer{tok: tok, bySrc: map[string]*list.Element{}, lru: list.New()}
}

// vocabulary builds the token trie: every token's bytes, none for control
// tokens (a grammar never produces them) but those that mark tool calls
// (their text, as the endpoint renders them: a call's grammar writes them),
// and the tokens that end a generation.
func (c *constrainer) vocabulary() *grammar.Vocab {
	c.once.Do(func() {
		n := c.tok.NVocab()
		marks := toolMarks(c.tok)
		pieces := make([][]byte, n)
		var eog []int32
		for id := range int32(n) {
			if c.tok.IsEOG(id) {
				eog = append(eog, id)
				continue
			}
			if s, ok := marks[id]; ok {
				pieces[id] = []byte(s)
			} else if !c.tok.IsControl(id) {
				pieces[id] = c.tok.Piece(id)
			}
		}
		c.vocab = grammar.NewVocab(pieces, eog)
	})
	return c.vocab
}

func (c *constrainer) Grammar(src string, prefix []byte) (openai.Constraint, error) {
	cc, err := c.compile(src)
	if err != nil {
		return nil, err
	}
	st := cc.Start()
	// A fresh state has no mask yet, so its matcher may be advanced.
	if len(prefix) > 0 && !st.Matcher().AcceptBytes(prefix) {
		return nil, fmt.Errorf("grammar: the answer's text %q does not start it", prefix)
	}
	return st, nil
}

// compile returns src compiled for the vocabulary, from the cache when it
// was compiled before.
func (c *constrainer) compile(src string) (*grammar.Constraint, error) {
	c.mu.Lock()
	if e, ok := c.bySrc[src]; ok {
		c.lru.MoveToFront(e)
		cc := e.Value.(*compiled).c
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	g, err := grammar.Parse(src)
	if err != nil {
		return nil, err
	}
	cc := grammar.NewConstraint(g, c.vocabulary())
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.bySrc[src]; ok { // compiled meanwhile by another request
		c.lru.MoveToFront(e)
		return e.Value.(*compiled).c, nil
	}
	c.bySrc[src] = c.lru.PushFront(&compiled{src: src, c: cc})
	for c.lru.Len() > maxCompiledGrammars {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.bySrc, old.Value.(*compiled).src)
	}
	return cc, nil
}

func (c *constrainer) SchemaRules(schema []byte, prefix string) (string, string, error) {
	return jsonschema.Rules(schema, prefix)
}

func (c *constrainer) AnyObject() string { return jsonschema.AnyObject() }
