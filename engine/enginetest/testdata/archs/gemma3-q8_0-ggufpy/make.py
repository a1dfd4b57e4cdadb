# Writes model.gguf: a small random gemma3 with Debian's gguf-py (llama.cpp 0.7.0's own tensor
# names and writer), independently of shoal's synth package. Run inside llama-oracle's chroot:
#   ../shared/tools/llama-oracle/run python3 make.py VOCAB.gguf OUT.gguf ../ggufpy_vocab.py
# VOCAB.gguf gives the tokenizer.* fields (any GGUF with a byte-level BPE vocabulary of 512).
import os
import sys
import numpy as np
import gguf
sys.path.insert(0, os.path.dirname(sys.argv[3]))  # ../ggufpy_vocab.py, given so that run mounts it
import ggufpy_vocab  # noqa: E402
from gguf import MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType as Q

vocab_path, out = sys.argv[1], sys.argv[2]
n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, window = 128, 6, 4, 2, 32, 128, 6
rng = np.random.default_rng(7)

def name(t, bid=None):
    return TENSOR_NAMES[t].format(bid=bid) + ".weight"

v = ggufpy_vocab.read(vocab_path)
n_vocab = len(v.tokens)

w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[MODEL_ARCH.GEMMA3])
w.add_name("gemma3 written by gguf-py")
w.add_context_length(2048)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_key_length(head_dim)
w.add_value_length(head_dim)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(1e6)
w.add_sliding_window(window)
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
ggufpy_vocab.add(w, v)

def matrix(t, rows, cols, bid=None, std=0.05):
    # numpy shape (rows, cols): ggml's ne = [cols, rows]
    x = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    w.add_tensor(name(t, bid), gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)

def norm(t, n, bid=None):
    w.add_tensor(name(t, bid), (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

matrix(MODEL_TENSOR.TOKEN_EMBD, n_vocab, n_embd, std=0.1)
for b in range(n_layer):
    norm(MODEL_TENSOR.ATTN_NORM, n_embd, b)
    matrix(MODEL_TENSOR.ATTN_Q, n_head * head_dim, n_embd, b)
    matrix(MODEL_TENSOR.ATTN_K, n_head_kv * head_dim, n_embd, b)
    matrix(MODEL_TENSOR.ATTN_V, n_head_kv * head_dim, n_embd, b)
    norm(MODEL_TENSOR.ATTN_Q_NORM, head_dim, b)
    norm(MODEL_TENSOR.ATTN_K_NORM, head_dim, b)
    matrix(MODEL_TENSOR.ATTN_OUT, n_embd, n_head * head_dim, b)
    norm(MODEL_TENSOR.ATTN_POST_NORM, n_embd, b)
    norm(MODEL_TENSOR.FFN_NORM, n_embd, b)
    matrix(MODEL_TENSOR.FFN_GATE, n_ff, n_embd, b)
    matrix(MODEL_TENSOR.FFN_UP, n_ff, n_embd, b)
    matrix(MODEL_TENSOR.FFN_DOWN, n_embd, n_ff, b)
    norm(MODEL_TENSOR.FFN_POST_NORM, n_embd, b)
norm(MODEL_TENSOR.OUTPUT_NORM, n_embd)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
