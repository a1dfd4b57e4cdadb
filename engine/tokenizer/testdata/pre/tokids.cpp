// tokids: llama.cpp's token ids for test strings, with the vocabulary of a GGUF file (loaded
// vocab-only), for shoal's pre-tokenizer checks. Built in llama-oracle's chroot against Debian's
// libllama 0.7.0:
//   g++ -O2 -std=c++17 tokids.cpp -lllama -lggml -lggml-base -o tokids
//   tokids MODEL.gguf STRINGS OUT [special]
// STRINGS holds test strings each followed by "\n__ggml_vocab_test__\n"; OUT gets one line per
// string, its ids each after a space. Without "special": no BOS, special text not parsed; with it,
// llama_tokenize's add_special and parse_special are both on (as for a chat prompt).
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && std::string(argv[4]) == "special")) {
        fprintf(stderr, "usage: tokids MODEL STRINGS OUT [special]\n");
        return 2;
    }
    const bool special = argc == 5;
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss; ss << in.rdbuf();
    std::string all = ss.str(), sep = "\n__ggml_vocab_test__\n";
    FILE *out = fopen(argv[3], "w");
    for (size_t pos = 0; pos < all.size();) {
        size_t end = all.find(sep, pos);
        if (end == std::string::npos) break;
        std::string text = all.substr(pos, end - pos);
        std::vector<llama_token> toks(text.size() + 8);
        int n = llama_tokenize(vocab, text.c_str(), text.size(), toks.data(), toks.size(), special, special);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        for (int i = 0; i < n; i++) fprintf(out, " %d", toks[i]);
        fprintf(out, "\n");
        pos = end + sep.size();
    }
    fclose(out);
    return 0;
}
