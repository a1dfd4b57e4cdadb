package tokenizer

// ByteEncode exposes the GPT-2 byte-to-unicode mapping to the external
// tests, which build byte-level vocabularies from raw token bytes.
var ByteEncode = byteEncode
