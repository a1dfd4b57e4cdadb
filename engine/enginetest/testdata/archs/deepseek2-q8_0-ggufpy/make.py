# Writes model.gguf: a small random deepseek2 (DeepSeek-V3's architecture, multi-head latent
# attention as llama.cpp's converter writes it for the absorbed form) with Debian's gguf-py
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
n_embd, n_head = 128, 4
q_lora, kv_lora = 96, 64                       # the queries' rank; the latent the cache holds
nope, rope, v_head = 32, 16, 32                # a query head: nope + rope; a value head
n_layer, n_dense = 3, 1
n_ff_dense, n_ff_exp, n_expert, n_used, n_shared = 256, 64, 8, 2, 1
n_group, n_group_used = 4, 2
rng = np.random.default_rng(17)

def name(t, bid=None, suffix=".weight"):
    return TENSOR_NAMES[t].format(bid=bid) + suffix

v = ggufpy_vocab.read(vocab_path)
n_vocab = len(v.tokens)

w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[MODEL_ARCH.DEEPSEEK2])
w.add_name("deepseek2 written by gguf-py")
w.add_context_length(2048)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff_dense)
w.add_head_count(n_head)
w.add_head_count_kv(1)                         # the latent: one row per token
w.add_key_length(kv_lora + rope)
w.add_value_length(kv_lora)
w.add_key_length_mla(nope + rope)
w.add_value_length_mla(v_head)
w.add_q_lora_rank(q_lora)
w.add_kv_lora_rank(kv_lora)
w.add_rope_dimension_count(rope)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(10000.0)
w.add_expert_count(n_expert)
w.add_expert_used_count(n_used)
w.add_expert_shared_count(n_shared)
w.add_expert_feed_forward_length(n_ff_exp)
w.add_leading_dense_block_count(n_dense)
w.add_expert_weights_scale(2.5)
w.add_expert_weights_norm(True)
w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
w.add_expert_group_count(n_group)
w.add_expert_group_used_count(n_group_used)
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
for b in range(n_layer):
    norm(MODEL_TENSOR.ATTN_NORM, n_embd, b)
    matrix(MODEL_TENSOR.ATTN_Q_A, (q_lora, n_embd), b)
    norm(MODEL_TENSOR.ATTN_Q_A_NORM, q_lora, b)
    matrix(MODEL_TENSOR.ATTN_Q_B, (n_head * (nope + rope), q_lora), b)   # per head: nope, then rope
    matrix(MODEL_TENSOR.ATTN_KV_A_MQA, (kv_lora + rope, n_embd), b)      # the latent, then the shared key
    norm(MODEL_TENSOR.ATTN_KV_A_NORM, kv_lora, b)
    matrix(MODEL_TENSOR.ATTN_K_B, (n_head, kv_lora, nope), b, std=0.2)    # ne [nope, kv_lora, n_head]
    matrix(MODEL_TENSOR.ATTN_V_B, (n_head, v_head, kv_lora), b, std=0.2)  # ne [kv_lora, v_head, n_head]
    matrix(MODEL_TENSOR.ATTN_OUT, (n_embd, n_head * v_head), b)
    norm(MODEL_TENSOR.FFN_NORM, n_embd, b)
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
norm(MODEL_TENSOR.OUTPUT_NORM, n_embd)
matrix(MODEL_TENSOR.OUTPUT, (n_vocab, n_embd))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
