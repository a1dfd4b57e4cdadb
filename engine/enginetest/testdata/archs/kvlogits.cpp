// kvlogits: llama.cpp's logits for a prompt given as token ids, with the K and V cache in a
// chosen type and flash attention on or off, for shoal's quantized-cache cases. Built in
// llama-oracle's chroot against Debian's libllama 0.7.0:
//   g++ -O2 -std=c++17 kvlogits.cpp -lllama -lggml -lggml-base -o kvlogits
//   kvlogits MODEL.gguf 1,2,3 f16|q8_0|q4_0 fa|nofa OUT.f32
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static ggml_type cache_type(const char *s) {
    if (!strcmp(s, "q8_0")) return GGML_TYPE_Q8_0;
    if (!strcmp(s, "q4_0")) return GGML_TYPE_Q4_0;
    return GGML_TYPE_F16;
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: kvlogits MODEL TOKENS TYPE fa|nofa OUT.f32\n"); return 2; }
    llama_backend_init();
    llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    std::vector<llama_token> toks;
    for (char *p = argv[2]; *p;) { toks.push_back(strtol(p, &p, 10)); if (*p == ',') p++; }
    const int n = toks.size();
    auto cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n < 64 ? 64 : n;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = cp.type_v = cache_type(argv[3]);
    cp.flash_attn_type = strcmp(argv[4], "fa") ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) { b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
    if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(argv[5], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), 4, nv, f);
    fclose(f);
    return 0;
}
