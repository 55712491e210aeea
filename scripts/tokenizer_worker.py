#!/usr/bin/env python3
"""autosp-sample's tokenizer: a Hugging Face `tokenizers` tokenizer.json (the one
scripts/prepare_data.py saved beside the shards) answering one JSON line per request on stdin:
{"encode": "text"} -> {"ids": [...]}, {"decode": [ids]} -> {"text": "..."}. Before any request it
prints {"ready": true}, or {"bad_tokenizer": "why"} and exits 1 when the file does not load (a
usage error on the C++ side, not a traceback). Run under the venv of scripts/hf-venv.sh
(transformers brings `tokenizers`).
  tokenizer_worker.py TOKENIZER.json
"""
import json
import sys

from tokenizers import Tokenizer


def main():
    try:
        tok = Tokenizer.from_file(sys.argv[1])
    except Exception as e:  # noqa: BLE001 - a file that does not load is the caller's input error
        why = " ".join(f"{type(e).__name__}: {e}".split())  # one line
        print(json.dumps({"bad_tokenizer": why}), flush=True)
        sys.exit(1)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if "encode" in req:
                reply = {"ids": tok.encode(req["encode"], add_special_tokens=False).ids}
            else:
                reply = {"text": tok.decode(req["decode"], skip_special_tokens=False)}
        except Exception as e:  # noqa: BLE001 - every failure is the reply, not a crash
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
