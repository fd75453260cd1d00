"""Published fine-tunes whose config.json prices as a known model's: offline names for them.

A chat or instruct model is its base model's weights tuned further: the same layers, widths, heads,
experts and vocabulary, so the same kernels at the same shapes. Each id's published config.json has
the base's value in every key the shape reads (:func:`calibrate.hf_config.read_config`), as its model
card publishes it (nothing is fetched here to check it again); what differs (end-of-sequence ids, the chat template, the generation defaults) is
not priced. A fine-tune whose shape differs is left out (Qwen3's base models hold a 32,768-token
context against the post-trained models' 40,960) or is a built-in of its own (Mixtral-8x22B-Instruct's
32,768-token vocabulary against the base's 32,000). Ids match as the Hugging Face Hub
matches them, whatever the case. A config.json the user has (a path, the local cache) always wins.
"""

from __future__ import annotations

# fine-tune id -> the built-in (calibrate/models/*.json) with its shape
SAME_SHAPE = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-chat-hf": "llama-2-70b",
    "codellama/CodeLlama-34b-hf": "codellama-34b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
}


def base_of(model_id: str) -> str | None:
    """The built-in whose shape ``model_id``'s published config.json has, or None."""
    wanted = model_id.lower()
    return next((base for variant, base in SAME_SHAPE.items() if variant.lower() == wanted), None)
