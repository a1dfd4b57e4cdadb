# Writes model.gguf: a small random glm4moe (GLM-4.5's architecture) with Debian's gguf-py
# (llama.cpp 0.7.0's own tensor names, keys and writer), independently of shoal's synth
# package. Run inside llama-oracle's chroot:
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
n_embd, n_head, n_head_kv, head_dim, n_rot = 128, 4, 2, 32, 16
n_layer, n_nextn, n_dense = 3, 1, 1            # blocks that run, MTP blocks after them, dense ones first
n_ff_dense, n_ff_exp, n_expert, n_used, n_shared = 256, 64, 4, 2, 1
rng = np.random.default_rng(11)

def name(t, bid=None, suffix=".weight"):
    return TENSOR_NAMES[t].format(bid=bid) + suffix

v = ggufpy_vocab.read(vocab_path)
n_vocab = len(v.tokens)

w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[MODEL_ARCH.GLM4_MOE])
w.add_name("glm4moe written by gguf-py")
w.add_context_length(2048)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer + n_nextn)
w.add_feed_forward_length(n_ff_dense)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_rope_dimension_count(n_rot)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_freq_base(1e6)
w.add_expert_count(n_expert)
w.add_expert_used_count(n_used)
w.add_expert_shared_count(n_shared)
w.add_expert_feed_forward_length(n_ff_exp)
w.add_leading_dense_block_count(n_dense)
w.add_expert_weights_scale(1.8)
w.add_expert_weights_norm(True)
w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
w.add_nextn_predict_layers(n_nextn)
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
ggufpy_vocab.add(w, v)

def matrix(t, shape, bid=None, std=0.05, q=Q.Q8_0):
    # numpy shape (..., rows, cols): ggml's ne = [cols, rows, ...]
    x = (rng.standard_normal(shape) * std).astype(np.float32)
    if q == Q.F32:
        w.add_tensor(name(t, bid), x)
    else:
        w.add_tensor(name(t, bid), gguf.quants.quantize(x, q), raw_dtype=q)

def vector(t, n, bid=None, mean=0.0, std=0.05, suffix=".weight"):
    w.add_tensor(name(t, bid, suffix), (mean + std * rng.standard_normal(n)).astype(np.float32))

def norm(t, n, bid=None):
    vector(t, n, bid, 1.0, 0.1)

matrix(MODEL_TENSOR.TOKEN_EMBD, (n_vocab, n_embd), std=0.1)
for b in range(n_layer + n_nextn):
    norm(MODEL_TENSOR.ATTN_NORM, n_embd, b)
    matrix(MODEL_TENSOR.ATTN_Q, (n_head * head_dim, n_embd), b)
    matrix(MODEL_TENSOR.ATTN_K, (n_head_kv * head_dim, n_embd), b)
    matrix(MODEL_TENSOR.ATTN_V, (n_head_kv * head_dim, n_embd), b)
    vector(MODEL_TENSOR.ATTN_Q, n_head * head_dim, b, suffix=".bias")
    vector(MODEL_TENSOR.ATTN_K, n_head_kv * head_dim, b, suffix=".bias")
    vector(MODEL_TENSOR.ATTN_V, n_head_kv * head_dim, b, suffix=".bias")
    matrix(MODEL_TENSOR.ATTN_OUT, (n_embd, n_head * head_dim), b)
    norm(MODEL_TENSOR.ATTN_POST_NORM, n_embd, b)  # the FFN's norm
    if b < n_dense:
        matrix(MODEL_TENSOR.FFN_GATE, (n_ff_dense, n_embd), b)
        matrix(MODEL_TENSOR.FFN_UP, (n_ff_dense, n_embd), b)
        matrix(MODEL_TENSOR.FFN_DOWN, (n_embd, n_ff_dense), b)
        continue
    # router logits of about unit spread (1.5/sqrt(n_embd)), F32 as converted files keep it
    matrix(MODEL_TENSOR.FFN_GATE_INP, (n_expert, n_embd), b, std=1.5 / np.sqrt(n_embd), q=Q.F32)
    vector(MODEL_TENSOR.FFN_EXP_PROBS_B, n_expert, b, suffix=".bias")
    matrix(MODEL_TENSOR.FFN_GATE_EXP, (n_expert, n_ff_exp, n_embd), b)
    matrix(MODEL_TENSOR.FFN_UP_EXP, (n_expert, n_ff_exp, n_embd), b)
    matrix(MODEL_TENSOR.FFN_DOWN_EXP, (n_expert, n_embd, n_ff_exp), b)
    matrix(MODEL_TENSOR.FFN_GATE_SHEXP, (n_ff_exp * n_shared, n_embd), b)
    matrix(MODEL_TENSOR.FFN_UP_SHEXP, (n_ff_exp * n_shared, n_embd), b)
    matrix(MODEL_TENSOR.FFN_DOWN_SHEXP, (n_embd, n_ff_exp * n_shared), b)
    if b >= n_layer:  # the multi-token-prediction block's own tensors (llama.cpp loads, never runs them)
        matrix(MODEL_TENSOR.NEXTN_EH_PROJ, (n_embd, 2 * n_embd), b)
        norm(MODEL_TENSOR.NEXTN_ENORM, n_embd, b)
        norm(MODEL_TENSOR.NEXTN_HNORM, n_embd, b)
        norm(MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM, n_embd, b)
norm(MODEL_TENSOR.OUTPUT_NORM, n_embd)
matrix(MODEL_TENSOR.OUTPUT, (n_vocab, n_embd))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
