// Package jsonschema converts a JSON Schema (the schema of OpenAI's
// response_format {"type": "json_schema", "json_schema": {"schema": ...}})
// into a GBNF grammar, llama.cpp's grammar dialect, for constrained
// decoding. [Grammar] returns a complete grammar with root rule "root";
// [Rules] returns rules with a name prefix for embedding in a larger
// grammar; [AnyObject] is the grammar of response_format json_object.
//
// The package emits text only. Every document of the grammar's language is
// valid against the schema; the converse does not hold, because the
// grammar deliberately narrows some choices (below) to keep the output
// bounded, canonical and easy for a model to follow.
//
// # Supported keywords
//
//   - type: a string or an array of types (object, array, string, number,
//     integer, boolean, null). Without type, the type is inferred from
//     type-specific keywords (properties → object, items → array,
//     minLength → string, minimum → number, …); with none, any JSON value.
//   - properties, required, additionalProperties (see the object choice).
//   - items, prefixItems (and the draft-07 tuple form items: [...] with
//     additionalItems), minItems, maxItems; uniqueItems: false.
//   - enum, const: the values are emitted literally (compact JSON, keys in
//     schema order), as a trie so that values share prefixes; values whose
//     JSON type is not allowed by a sibling "type" are dropped.
//   - anyOf, and oneOf treated as anyOf: a document may match several
//     branches of a oneOf, which is then invalid; use disjoint branches.
//     Sibling keywords are merged into every branch.
//   - allOf, and keywords next to $ref, when the schemas merge keyword by
//     keyword: properties (recursively), required (union), type
//     (intersection), min*/max* (tightest), equal values otherwise.
//     Anything else is an error.
//   - $ref to local JSON pointers: "#", "#/$defs/...", "#/definitions/...".
//     A referenced schema becomes one rule, so recursive schemas become
//     recursive rules. A cycle that makes no progress (a schema that
//     reaches itself through $ref, anyOf, oneOf or allOf without first
//     consuming input, i.e. left recursion) is refused.
//   - minLength, maxLength, counted in code points. A \uXXXX escape never
//     encodes a surrogate, so each escape is exactly one code point;
//     characters outside the Basic Multilingual Plane are written raw.
//   - minimum, maximum, exclusiveMinimum, exclusiveMaximum (also draft-04
//     boolean exclusives) for integers: exact decimal digit-range rules,
//     negative bounds included (bounds beyond ±10^18 are clamped). For
//     type number they are refused (not expressible exactly here).
//   - format: date, time, date-time (RFC 3339; February 29 and leap
//     seconds are never produced), uuid. Other formats are refused.
//   - pattern: a regular-expression subset translated into GBNF: literals,
//     escapes (\d \w \s \D \W \S \n \t \r \f \v \xHH \uXXXX and escaped
//     punctuation), ., classes [...] and [^...], groups (...) and (?:...),
//     |, ? * + {n} {n,} {n,m} (lazy forms too). A pattern anchored with ^
//     and $ must match the whole string; otherwise any characters may
//     come before and after. Where ECMA-262 and RE2 differ (\s, \S, .) the
//     intersection is used. Lookaround, backreferences, \b, and anchors
//     inside the pattern are refused. Not combined with minLength,
//     maxLength or format.
//
// Annotations (title, description, examples, default, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, content*) and unknown keywords
// are ignored. Keywords that would constrain the value but are not
// supported give an error naming the keyword and the JSON pointer of its
// schema, for example
//
//	jsonschema: "patternProperties" at /properties/a is not supported
//
// Unsupported: patternProperties, propertyNames, dependentRequired,
// dependentSchemas, dependencies, unevaluatedProperties, unevaluatedItems,
// contains, minContains, maxContains, uniqueItems: true, not, if/then/else,
// multipleOf, $dynamicRef, $recursiveRef, remote $ref, bounds on number,
// other formats, enum/const next to other constraints, minProperties above
// the number of required properties, maxProperties below the number of
// declared properties.
//
// # Objects
//
// Properties are written in declared order (the order of "properties",
// then required names that have no schema). Required properties are always
// written, optional ones optionally. Only declared properties are emitted,
// whatever additionalProperties says: false (OpenAI strict mode) allows
// nothing else, and when it is absent, true or a schema the extra
// properties it allows are valid but never generated, which keeps the
// output bounded and useful. An object schema that declares no property
// and does not forbid additional ones is a free-form map: any keys, values
// valid against additionalProperties (any value when absent).
//
// # Bounds
//
// The grammar keeps sampled output finite: whitespace between tokens is
// empty, one space, or a newline and at most 20 spaces or tabs; integers
// without bounds have at most 16 digits and no leading zeros; a number's
// fraction has at most 16 digits and its exponent at most 2 (so numbers
// stay within float64 range); no leading or trailing whitespace around the
// document. Strings follow JSON syntax (escapes \" \\ \/ \b \f \n \r \t
// \uXXXX; no raw control characters or DEL) and are unbounded unless
// maxLength says otherwise.
//
// Hostile schemas are refused rather than followed: schema JSON nested
// deeper than 128 levels, repetition counts (minLength, maxLength,
// minItems, maxItems, {n,m}) above 4096, more than 512 consecutive
// optional properties, grammars above 1 MiB, and conversions that exceed
// fixed work limits (allOf/$ref merging, subschema count and depth).
package jsonschema
