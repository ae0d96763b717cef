"""What lokid knows of llama.cpp's model architectures by name: the hybrid ones
(attention plus recurrent layers), and the keys only recurrent blocks write (the rule
for an architecture newer than the list: :mod:`lokid.core.model.modelinfo`)."""

# llm_arch_is_hybrid() in src/llama-arch.cpp, llama.cpp b11434, by GGUF arch name.
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe",
    "nemotron_h", "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3",
    "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})
# Key families (after "<arch>.") that only recurrent / linear-attention blocks write.
RECURRENT_KEY_PREFIXES = ("ssm.", "wkv.", "shortconv.", "kda.", "full_attention_interval")
