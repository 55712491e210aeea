"""A tiny chat model directory for the fine-tuning tests, made offline (no hub): a byte-level BPE
tokenizer trained here on a few words (Hugging Face `tokenizers`, as tests/apps/prepare_data.sh
makes its tokenizers) with the ChatML specials, a tokenizer_config.json holding a chat template,
and, with --model, a randomly initialised LlamaForCausalLM (transformers, seeded) saved beside it.

  chat_fixture.py DIR [--template chatml|inst] [--model] [--conversations FILE N]

Templates:
  chatml  ChatML with {% generation %} markers around each assistant turn's content and <|im_end|>
          (the newline after it is outside, as in TRL's training templates), and the generation
          prompt "<|im_start|>assistant\\n".
  inst    Llama-2-like "[INST] ... [/INST] answer<|endoftext|>", no markers, no generation prompt.
--conversations FILE N writes N conversations (system, user, assistant, user, assistant; answers
that follow from the question, so a tiny model can learn them) as .jsonl to FILE.
"""
import argparse
import json
import os
import random
import sys

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "what is the next word after say it twice please answer briefly you are a helpful assistant ok").split()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
          "{%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
          "{%- else %}{{ m['content'] + '<|im_end|>' }}{%- endif %}{{ '\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}")
INST = ("{%- for m in messages %}{%- if m['role'] == 'system' %}{{ '<<SYS>>' + m['content'] + '<</SYS>>' }}"
        "{%- elif m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
        "{%- else %}{{ ' ' + m['content'] + eos_token }}{%- endif %}{%- endfor %}")


def conversation(rng):
    i = rng.randrange(len(WORDS) - 1)
    j = rng.randrange(len(WORDS) - 1)
    return {"messages": [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": f"what is the next word after {WORDS[i]}"},
        {"role": "assistant", "content": f"{WORDS[i + 1]}"},
        {"role": "user", "content": f"say {WORDS[j]} twice please"},
        {"role": "assistant", "content": f"{WORDS[j]} {WORDS[j]}"}]}


def make_tokenizer(d, template):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS), "<<SYS>> <</SYS>> [INST] [/INST] system user assistant\n"] * 4
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
           "pad_token": "<|endoftext|>", "model_max_length": 1024,
           "chat_template": CHATML if template == "chatml" else INST}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return tok.get_vocab_size(with_added_tokens=True)


def make_model(d, vocab):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=0, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--template", choices=("chatml", "inst"), default="chatml")
    ap.add_argument("--model", action="store_true")
    ap.add_argument("--conversations", nargs=2, metavar=("FILE", "N"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    vocab = make_tokenizer(a.dir, a.template)
    if a.model:
        make_model(a.dir, vocab)
    if a.conversations:
        rng = random.Random(1)
        with open(a.conversations[0], "w") as f:
            for _ in range(int(a.conversations[1])):
                f.write(json.dumps(conversation(rng)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
