"""Tiny GPT-2 and Llama directories written by `transformers` itself (random init, nothing
downloaded), each with a tokenizer.json, and the text corpus they train on: what the
Hugging Face tests of both tiers read."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = "".join(f"def add_{i}(a, b):\n    return a + b * {i % 7}\n\n" for i in range(600))


def bpe_tokenizer(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    return tok


def write_models(root: Path) -> Path:
    """ROOT/gpt2, ROOT/llama and ROOT/corpus.txt."""
    import transformers

    torch.manual_seed(0)
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, max_position_embeddings=64, bos_token_id=0, eos_token_id=0))
    tok = bpe_tokenizer(512)
    for name, m in (("gpt2", gpt), ("llama", llama)):
        m.save_pretrained(root / name)
        tok.save(str(root / name / "tokenizer.json"))
    (root / "corpus.txt").write_text(TEXT)
    return root
