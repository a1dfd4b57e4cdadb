// Package tokenizer owns text ⇄ token-id conversion for shoal. It builds a
// Tokenizer from a GGUF file's tokenizer.ggml.* metadata (FromGGUF) or from
// plain Go data (New with a Vocab), and reproduces llama.cpp's
// llama_tokenize / llama_token_to_piece / llama_detokenize behaviour (as of
// llama.cpp c392e50, Feb 2025) token for token: SentencePiece BPE with
// scores and byte fallback ("llama" models), GPT-2-style byte-level BPE
// with merge ranks ("gpt2" models) behind the regex pre-tokenizers named by
// tokenizer.ggml.pre, and BERT's WordPiece ("bert" models, llama.cpp's WPM,
// with its later BertNormalizer lowercase/strip_accents options), including
// special-token partitioning, BOS/EOS ([CLS]/[SEP]) handling and
// end-of-generation detection. It also provides a streaming Decoder that
// only emits complete UTF-8, and ByteLevelVocab and TinyWordPieceVocab, the
// small deterministic vocabularies shoal builds for random-weight test
// models. Other tokenizer families (Unigram, RWKV) are rejected with an
// error.
package tokenizer
