#!/usr/bin/env python3
"""A chat prompt for autosp-sample, rendered with a model directory's own chat template (its
tokenizer_config.json "chat_template", by transformers' apply_chat_template, as
scripts/prepare_data.py --chat renders the training conversations):

  chat_prompt.py MODEL_DIR [--system TEXT] [--ids] MESSAGE
                      prints the conversation [system,] user MESSAGE with the generation prompt:
                      its token ids, comma-separated, for autosp-sample --prompt-ids (--ids; as
                      apply_chat_template(tokenize=True) gives them), else its text (a prompt that
                      ends with a newline loses it in the shell's "$(...)": prefer --ids)
  chat_prompt.py MODEL_DIR --turn-end                 prints the id of the token that ends an assistant
                                                      turn (for autosp-sample --eos-token-id)

The turn's end is found the way prepare_data.py finds the assistant's tokens: the last token of what
an assistant message adds to the rendering (<|im_end|> for ChatML, </s> for Llama 2). Runs under
the venv of scripts/hf-venv.sh. Bad input is one `error:` line and exit 2.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare_data as pd  # noqa: E402


def main():
    ap = pd.ArgParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("message", nargs="?")
    ap.add_argument("--system")
    ap.add_argument("--turn-end", action="store_true")
    ap.add_argument("--ids", action="store_true")
    a = ap.parse_intermixed_args()
    hf = pd.load_hf_tokenizer(a.model_dir, "chat")
    if a.turn_end:
        msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        ids, mask = pd.chat_example(hf, msgs, -1, "--turn-end")
        turn = [t for t, m in zip(ids, mask) if m]
        if not turn:
            pd.fail(f"{a.model_dir}: its chat template writes no assistant turn")
        print(turn[-1])
        return 0
    if a.message is None:
        pd.fail("give MESSAGE or --turn-end")
    msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.message}]
    text = pd.render(hf, msgs, True, "the prompt")
    if a.ids:
        print(",".join(str(t) for t in hf(text, add_special_tokens=False)["input_ids"]))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
