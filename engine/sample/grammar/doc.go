// Package grammar is the core of constrained decoding: it compiles a GBNF
// grammar (the llama.cpp dialect) and tells the sampler, token by token, which
// vocabulary entries keep the output inside the grammar's language.
//
// # Model
//
// [Parse] compiles the source into a byte-level pushdown automaton. Grammar
// semantics are over Unicode code points, but the automaton advances one byte
// at a time: every literal is compiled to its UTF-8 bytes, an ASCII-only
// character class to one byte-set element, and any other class (including
// negated classes and `.`) to a small deterministic byte automaton built from
// the classic UTF-8 range split (so surrogates, overlong forms and code points
// above U+10FFFF are never accepted, and a class costs one stack however many
// byte sequences it has). Groups and repetitions become helper rules;
// x{m,n} costs O(n) elements (m references, then a chain of right-recursive
// optional rules) so nesting repetitions never multiplies the compiled size.
// All rules are flattened into one array of elements: byte set, class
// automaton state, rule reference, end of alternative.
//
// A parse state ([Matcher]) is a set of stacks of positions into that array,
// as in llama.cpp's grammar engine: each stack's top is a byte-set (or class
// automaton) element still to match, the entries below it are return addresses, and the empty
// stack means root is complete. Accepting a byte keeps the stacks whose top
// set contains it, moves past that element and expands rule references and
// alternative ends until every stack again tops at a byte set. A reference in
// tail position replaces its frame rather than pushing one, so right-recursive
// repetitions run in constant stack depth. Stacks are deduplicated, and a
// canonical (sorted) encoding of the set is the state's key.
//
// Left recursion would make the expansion loop, so Parse detects it (taking
// rules that can match the empty string into account) and refuses the
// grammar. Grammars come from clients and are treated as hostile: the source
// size, repetition bounds ([MaxRepeat]), compiled size ([MaxElements]) and
// parenthesis nesting are capped at parse time, and at run time a state holds
// at most 1024 stacks of depth at most 2048, and one byte transition does a
// bounded amount of expansion work; a byte that would exceed these limits is
// refused. Errors are *[ParseError] values with a line:column position.
//
// # Token masks
//
// [NewVocab] builds, once per model, a byte trie over the token pieces.
// A [Constraint] binds a grammar to a vocabulary; a [State] is one sequence.
// [State.Mask] walks the trie depth first carrying the automaton state: a
// child is visited only if its byte is in the state's next-byte set, so whole
// subtrees of impossible tokens are pruned at their first refused byte, and
// every token ending at a visited node is allowed. Within a walk the distinct
// automaton states met are interned with a lazily filled byte transition
// table, so where many trie nodes share a state (inside a string, a number)
// a step is a table lookup rather than an expansion; the walk reuses its
// buffers and does not allocate in steady state. Masks are cached in the
// Constraint by the state's canonical key (bounded LRU, shared by all
// sequences), so a state that recurs — the common case for structured output
// — costs one key computation and a map lookup.
//
// End-of-generation tokens are not part of the trie: they are allowed exactly
// when [State.CanEnd] is true (root may be complete). Accepting one ends the
// sequence; later Accepts fail. When [State.Done] reports that no byte can
// follow, only end-of-generation tokens are allowed and the caller should
// stop. If no token at all is allowed (the vocabulary cannot continue the
// grammar and it cannot end) Mask returns an all-zero mask, which callers must
// treat as an error rather than sample from.
package grammar
