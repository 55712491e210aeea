"""A tiny Hugging Face model directory for the docs check (tests/docs/check_docs.py): a Qwen2 model
saved by transformers, with a byte-level BPE tokenizer trained on TEXT beside it, as a downloaded
model directory has (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).
  make_model.py DIR TEXT
"""
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

out, text = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([text], trainers.BpeTrainer(vocab_size=384, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
fast.save_pretrained(out)
cfg = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, eos_token_id=tok.token_to_id("<|endoftext|>"))
Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
print(f"{out}: a tiny Qwen2 ({cfg.vocab_size} tokens)")
