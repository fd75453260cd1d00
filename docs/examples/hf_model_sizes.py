"""The shapes specbatch reads from Hugging Face configs shipped with aiconfigurator-core, and their
parameter counts beside the sizes their model cards publish (docs/gpu-profiles.md).

    python docs/examples/hf_model_sizes.py
"""

from calibrate.configs import active_param_count, get_config, param_count

# model id -> (total, active) as the model card states it, in billions
PUBLISHED = {
    "meta-llama/Meta-Llama-3.1-8B": (8.03, None),
    "meta-llama/Meta-Llama-3.1-70B": (70.6, None),
    "Qwen/Qwen3-32B": (32.8, None),
    "Qwen/Qwen3-30B-A3B": (30.5, 3.3),
    "mistralai/Mixtral-8x7B-v0.1": (46.7, 12.9),
    "mistralai/Mixtral-8x22B-v0.1": (141, 39),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (109, 17),  # the card's total counts the vision encoder
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": (400, 17),
    "deepseek-ai/DeepSeek-V3": (671, 37),  # without the multi-token-prediction layer (the checkpoint's 685B)
    "moonshotai/Kimi-K2-Instruct": (1000, 32),
}


def main() -> None:
    print(f"{'model':<46} {'layers':>6} {'hidden':>6} {'heads':>8} {'experts':>13} {'window':>10} "
          f"{'params (B)':>10} {'active':>7} {'card':>11}")
    for model, (total, active) in PUBLISHED.items():
        c = get_config(model)
        experts = (f"{c.num_experts} top {c.experts_per_token}" + ("+1" if c.shared_expert_intermediate_size else "")
                   if c.is_moe else "-")
        window = f"{c.sliding_window} x{c.window_layers}" if c.sliding_window else "-"
        heads = f"{c.num_heads}/MLA" if c.is_mla else f"{c.num_heads}/{c.num_kv_heads}"
        card = f"{total:g}" + (f"/{active:g}" if active else "")
        print(f"{model:<46} {c.num_layers:>6} {c.hidden_size:>6} {heads:>8} "
              f"{experts:>13} {window:>10} {param_count(c) / 1e9:>10.2f} {active_param_count(c) / 1e9:>7.2f} "
              f"{card:>11}")


if __name__ == "__main__":
    main()
