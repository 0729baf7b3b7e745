#!/usr/bin/env python3
"""The test model of the real-engine tests, written at test time: a tiny llama-architecture
GGUF (2 layers, 64 wide, random weights drawn from a fixed seed) with the tokenizer of
llama.cpp's vocab-only `models/ggml-vocab-llama-spm.gguf` and a simple chat template added (that
file has none). It says nothing sensible, but llama-server loads it, serves it through its
OpenAI API and, at temperature 0, answers every prompt with the same text each time; about
8.5 MB. Written with the `gguf-py` writer that the llama.cpp source tree vendors.

Usage: make-test-gguf.py LLAMA_CPP_DIR [CACHE_DIR]. Prints the model's path; the file is cached
under CACHE_DIR (default ${FLOTILLA_CACHE:-~/.cache/flotilla}/test-gguf) by the hash of this
script and of the vocabulary, so a changed script writes a new model and an unchanged one is
not written again. Needs numpy (tests/gateway/requirements.txt)."""

import hashlib
import os
import sys

SEED = 20261206
N_LAYER, N_EMBD, N_FF, N_HEAD, N_CTX = 2, 64, 128, 4, 4096
# Every message opened by its role; the assistant's turn is left open, so a final assistant
# message (a prefill) is continued exactly where its text ends.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    llama = sys.argv[1]
    cache = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        os.environ.get("FLOTILLA_CACHE", os.path.expanduser("~/.cache/flotilla")), "test-gguf"
    )
    vocab = os.path.join(llama, "models", "ggml-vocab-llama-spm.gguf")
    h = hashlib.sha256()
    for path in (__file__, vocab):
        with open(path, "rb") as f:
            h.update(f.read())
    out = os.path.join(cache, f"tiny-llama-{h.hexdigest()[:16]}.gguf")
    if not os.path.exists(out):
        os.makedirs(cache, exist_ok=True)
        tmp = f"{out}.{os.getpid()}.tmp"
        write(llama, vocab, tmp)
        os.replace(tmp, out)
    print(out)


def write(llama, vocab, path):
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(vocab)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("flotilla-test-tiny-llama")
    w.add_block_count(N_LAYER)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # The tokenizer, copied field by field.
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    token_types = fields["tokenizer.ggml.token_type"].contents()
    n_vocab = len(tokens)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_scores(fields["tokenizer.ggml.scores"].contents())
    w.add_token_types(token_types)
    w.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"].contents())
    w.add_unk_token_id(fields["tokenizer.ggml.unknown_token_id"].contents())
    w.add_add_bos_token(fields["tokenizer.ggml.add_bos_token"].contents())
    w.add_add_eos_token(fields["tokenizer.ggml.add_eos_token"].contents())
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(SEED)

    def mat(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD, 1.0))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + t + ".weight", mat(N_EMBD, N_EMBD, N_EMBD**-0.5))
        w.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD, N_EMBD**-0.5))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD, N_EMBD**-0.5))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF, N_FF**-0.5))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    # Only ordinary text tokens can win: the output rows of control, unknown and byte tokens are
    # zero, far below the best of the others, so an answer never ends early on the end-of-text
    # token nor splits a character into bytes; it ends at max_tokens.
    output = mat(n_vocab, N_EMBD, 1.0)
    normal = int(gguf.TokenType.NORMAL)
    for tok, kind in enumerate(token_types):
        if kind != normal:
            output[tok] = 0
    w.add_tensor("output.weight", output)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
