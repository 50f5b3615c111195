"""Tiny random Llama pairs and a small byte-level tokenizer, built from configs (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The sky is blue because air scatters short wavelengths of sunlight more than long ones.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "def add(a, b):\n    return a + b\n",
    "Hello! How can I help you today? Tell me a short story about a cat.",
]
VOCAB_SIZE = 320


def tiny_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ChatML specials (ids 0..2) and a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHATML
    return fast


def tiny_llama(
    vocab_size: int = VOCAB_SIZE,
    hidden: int = 64,
    layers: int = 4,
    ffn: int = 128,
    seed: int = 0,
    heads: int = 4,
    kv_heads: int = 2,
) -> LlamaForCausalLM:
    """A random Llama in eval mode (fp32)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,  # tied random weights just copy the input token
    )
    return LlamaForCausalLM(config).eval()


def peaky_llama(vocab_size: int, seed: int, hidden: int, layers: int) -> LlamaForCausalLM:
    """A random Llama over a small vocabulary with a large-variance LM head: peaky distributions that
    differ from model to model, so acceptance is neither certain nor hopeless."""
    model = tiny_llama(vocab_size=vocab_size, hidden=hidden, layers=layers, ffn=2 * hidden, seed=seed)
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(hidden, vocab_size, bias=False)
    torch.manual_seed(seed + 100)
    torch.nn.init.normal_(model.lm_head.weight, std=1.5)
    return model.eval()


def tiny_mistral(
    hidden: int = 64, layers: int = 2, seed: int = 0, sliding_window: int = 8
) -> MistralForCausalLM:
    """A random Mistral with a (tiny) sliding attention window, in eval mode (fp32)."""
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=sliding_window,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    return MistralForCausalLM(config).eval()


def save_tiny_pair(root: Path) -> tuple[Path, Path]:
    """Write a tiny verifier (with tokenizer) and a tiny drafter folder under root; return both paths."""
    tokenizer = tiny_tokenizer()
    verifier_dir, drafter_dir = root / "verifier", root / "drafter"
    tiny_llama(hidden=64, layers=4, ffn=128, seed=0).save_pretrained(verifier_dir)
    tokenizer.save_pretrained(verifier_dir)
    tiny_llama(hidden=32, layers=2, ffn=64, seed=1).save_pretrained(drafter_dir)
    tokenizer.save_pretrained(drafter_dir)
    return verifier_dir, drafter_dir
