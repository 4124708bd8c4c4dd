"""A tiny random Llama written as a GGUF file, so tests can run the `llamacpp` backend in milliseconds.

`tiny_gguf_target(directory)` makes specframe's tiny test target (`specframe.testing.tiny_target`) and
writes its weights as a llama-architecture GGUF with the `gguf` package (a specframe dependency): the
target's `name` is the file, so `llamacpp` runs it. The weight matrices are quantized to Q4_1, as the
default model's are, and the target keeps their dequantized values, so both hold the same weights; Q4_1
also runs llama.cpp's kernels that compute each row alike in any batch (its float32 matrix products do
not: every row of a batch of two already differs from a one-row step). llama.cpp's rotary embedding pairs
neighbouring dimensions where transformers pairs the two halves of a head, so the query and key rows are
reordered on the way (what llama.cpp's own converter does for Llama checkpoints). The vocabulary is the
tiny character tokenizer's 96 tokens, as a SentencePiece-style list (llama.cpp needs one; specframe
tokenizes with the target's own tokenizer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import specframe
from specframe.testing.targets import CHARACTERS, tiny_target

LAYER_TENSORS = {  # transformers name in a decoder layer -> GGUF name in block i
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def rotary_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """The rows of a query or key projection reordered from halves-paired to neighbour-paired rotation."""
    rows = weight.shape[0] // heads
    return weight.reshape(heads, 2, rows // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def quantize(target: specframe.Target) -> dict[str, np.ndarray]:
    """Round the target's weight matrices to Q4_1 in place; their Q4_1 blocks (uint8 rows) by name."""
    from gguf import GGMLQuantizationType, quants

    blocks = {}
    with torch.no_grad():
        for name, weight in target.model.state_dict().items():
            if weight.dim() == 2:
                blocks[name] = quants.quantize(weight.float().numpy(), GGMLQuantizationType.Q4_1)
                rounded = quants.dequantize(blocks[name], GGMLQuantizationType.Q4_1)
                weight.copy_(torch.from_numpy(rounded.reshape(weight.shape)))
    return blocks


def write_gguf(target: specframe.Target, path: Path) -> Path:
    """Round `target` (a transformers Llama) to Q4_1 (`quantize`) and write it to `path` as a llama GGUF."""
    import gguf

    blocks = quantize(target)
    config = target.config
    state = {k: v.detach().float().numpy() for k, v in target.model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(CHARACTERS[:config.vocab_size])
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types([gguf.TokenType.NORMAL] * config.vocab_size)
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    writer.add_tensor("token_embd.weight", blocks["model.embed_tokens.weight"], raw_dtype=q4_1)
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", blocks["lm_head.weight"], raw_dtype=q4_1)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for i in range(config.num_hidden_layers):
        for source, name in LAYER_TENSORS.items():
            key = f"model.layers.{i}.{source}.weight"
            if key not in blocks:  # a norm: float32
                writer.add_tensor(f"blk.{i}.{name}.weight", state[key])
                continue
            rows = rotary_order(blocks[key], heads[name]) if name in heads else blocks[key]
            writer.add_tensor(f"blk.{i}.{name}.weight", rows, raw_dtype=q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_gguf_target(directory: Path, seed: int = 0, **options) -> specframe.Target:
    """specframe's tiny test target (options as `tiny_target`'s), written to a GGUF in `directory` and
    named by that file, so the `llamacpp` backend serves it."""
    target = tiny_target(seed, **options)
    path = write_gguf(target, Path(directory) / f"tiny-llama-{seed}.gguf")
    return specframe.Target(model=target.model, tokenizer=target.tokenizer, name=str(path))


def reference_rows(target: specframe.Target, ids: list[int]) -> torch.Tensor:
    """transformers' logits after every prefix of `ids` (for checking the conversion)."""
    with torch.inference_mode():
        return target.model(torch.tensor([ids])).logits[0].float()
