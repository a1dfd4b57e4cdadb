# The tokenizer fields the gguf-py cases (*-ggufpy/make.py) copy from another GGUF: read them
# with read(path), write them into a gguf.GGUFWriter with add(w, v).
import gguf


class Vocab:
    pass


def read(path):
    r = gguf.GGUFReader(path)
    f = r.fields
    v = Vocab()
    v.tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    v.types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    v.merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data]
    v.pre = bytes(f["tokenizer.ggml.pre"].parts[-1]).decode("utf-8")
    v.bos = int(f["tokenizer.ggml.bos_token_id"].parts[-1][0])
    return v


def add(w, v):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges(v.merges)
    w.add_bos_token_id(v.bos)
    w.add_add_bos_token(True)
