# Sourced by the app tests of mixtures of experts: tiny_mixtral FILE writes a tiny Mixtral config
# (2 layers of 4 experts, top 2, [24, 32] gates and ups, [32, 24] downs) that trains one step of 2
# synthetic sequences of 16 tokens on one thread.
tiny_mixtral() {
  cat >"$1" <<'JSON'
{"model": {"arch": "mixtral", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
           "num_local_experts": 4, "num_experts_per_tok": 2},
 "data": {"seq_len": 16, "batch_size": 2}, "train": {"steps": 1, "log_every": 1},
 "runtime": {"threads": 1}}
JSON
}
