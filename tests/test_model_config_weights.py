"""``ModelConfig`` validation, presets and HF parsing; ``Weights`` random init and safetensors round trip."""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model import weights as weights_module

HF_TINY = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 192, "vocab_size": 512,
}


def test_presets_and_derived_sizes():
    tiny = ModelConfig.preset("tiny")
    assert (tiny.dim, tiny.n_heads, tiny.n_kv_heads, tiny.head_dim, tiny.max_seq_len) == (64, 4, 2, 16, 256)
    assert (tiny.q_dim, tiny.kv_dim, tiny.qkv_dim) == (64, 32, 128)
    big = ModelConfig.preset("1b")
    assert big.head_dim == 128 and big.max_seq_len == 4096 and big.block_size == 16
    assert ModelConfig.preset("small").dim == 768
    # 1b: 16 layers of (3*D*D + D*D + 3*D*F + 2*D) plus embed, head, final norm
    d, f, v = 2048, 5632, 32000
    assert big.param_count() == 16 * (4 * d * d + 3 * d * f + 2 * d) + 2 * v * d + d
    assert big.weight_bytes() == 2 * (big.param_count() - v * d)  # the embedding gather is not streamed
    assert big.kv_bytes_per_token() == 2 * 16 * 2048 * 2
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.preset("7b")


def test_tied_config_counts_the_head_once():
    tiny = ModelConfig.preset("tiny")
    tied = tiny.replace(tie_word_embeddings=True)
    assert tiny.param_count() - tied.param_count() == tiny.vocab * tiny.dim
    assert tied.weight_bytes() == tiny.weight_bytes()


@pytest.mark.parametrize("changes, match", [
    ({"n_kv_heads": 3}, "multiple of n_kv_heads"),
    ({"dim": 66}, "multiple of n_heads"),
    ({"head_dim": 15}, "even"),
    ({"vocab": 0}, "vocab"),
    ({"n_layers": 2.0}, "n_layers"),
    ({"block_size": 32}, "block_size"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
])
def test_config_rejects_bad_shapes(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.preset("tiny").replace(**changes)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        ModelConfig.preset("tiny").dim = 128


def test_from_hf_defaults():
    cfg = ModelConfig.from_hf(HF_TINY)
    assert cfg.n_kv_heads == 4 and cfg.head_dim == 16
    assert cfg.rope_theta == 10000.0 and cfg.tie_word_embeddings is False
    assert cfg.rms_norm_eps == 1e-6 and cfg.max_seq_len == 2048


def test_from_hf_gqa_tied_head_dim_and_file(tmp_path):
    hf = dict(HF_TINY, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
              rms_norm_eps=1e-5, max_position_embeddings=8192, head_dim=32,
              rope_scaling={"rope_type": "default"})
    (tmp_path / "config.json").write_text(json.dumps(hf))
    for source in (hf, tmp_path, tmp_path / "config.json", str(tmp_path)):
        cfg = ModelConfig.from_hf(source)
        assert (cfg.n_kv_heads, cfg.head_dim, cfg.q_dim, cfg.qkv_dim) == (1, 32, 128, 192)
        assert cfg.tie_word_embeddings and cfg.rope_theta == 500000.0 and cfg.max_seq_len == 8192
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg


@pytest.mark.parametrize("extra, match", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling type 'llama3'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "bias"),
    ({"num_key_value_heads": 3}, "multiple of n_kv_heads"),
    ({"num_key_value_heads": 0}, "n_kv_heads must be a positive int, got 0"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "only LlamaForCausalLM"),
    ({"architectures": ["Gemma2ForCausalLM"]}, "only LlamaForCausalLM"),
    ({"sliding_window": 4096}, "sliding_window"),
    ({"rope_scaling": "linear"}, "rope_scaling must be null or an object"),
    ({"rms_norm_eps": None}, "rms_norm_eps must be a number, got None"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps must be a finite number > 0"),
    ({"rope_theta": -1.0}, "rope_theta must be a finite number > 0"),
])
def test_from_hf_rejects_what_we_do_not_implement(extra, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(dict(HF_TINY, **extra))


def test_from_hf_missing_key():
    hf = dict(HF_TINY)
    del hf["intermediate_size"]
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_hf(hf)


def test_random_weights_layout_scale_and_seed():
    cfg = ModelConfig.preset("tiny")
    w = Weights.random(cfg, seed=0)
    layer = w.layers[0]
    assert layer.w_qkv.shape == (128, 64) and layer.w_o.shape == (64, 64)
    assert layer.w_gate_up.shape == (384, 64) and layer.w_down.shape == (64, 192)
    assert w.embed.shape == w.lm_head.shape == (512, 64) and w.lm_head is not w.embed
    for name, a in w.arrays().items():
        assert a.dtype == ml_dtypes.bfloat16, name
        assert np.all(a.astype(np.float32) != 0), name
    std = layer.w_down.astype(np.float64).std()
    assert std == pytest.approx(1 / np.sqrt(192), rel=0.05)
    assert abs(w.final_norm.astype(np.float64) - 1).max() < 0.6
    assert w.nbytes == 2 * cfg.param_count()
    again, other = Weights.random(cfg, seed=0), Weights.random(cfg, seed=1)
    assert all(np.array_equal(a, again.arrays()[n]) for n, a in w.arrays().items())
    assert not np.array_equal(w.layers[1].w_qkv, other.layers[1].w_qkv)
    assert not np.array_equal(w.layers[0].w_o, w.layers[1].w_o)


def test_random_fill_in_chunks_is_deterministic(monkeypatch):
    monkeypatch.setattr(weights_module, "_CHUNK", 1000)  # many chunks per tensor, filled by several threads
    cfg = ModelConfig.preset("tiny")
    a, b = Weights.random(cfg, seed=5), Weights.random(cfg, seed=5)
    embed = a.embed.reshape(-1).view(np.uint16)
    assert np.array_equal(embed, b.embed.reshape(-1).view(np.uint16))
    assert not np.array_equal(embed[:1000], embed[1000:2000])  # chunks draw from distinct streams
    assert np.all(a.layers[1].w_gate_up.astype(np.float32) != 0)
    assert a.embed.astype(np.float64).std() == pytest.approx(1.0, rel=0.05)


def test_weights_reject_wrong_shapes_and_untied_head():
    cfg = ModelConfig.preset("tiny").replace(tie_word_embeddings=True)
    w = Weights.random(cfg, seed=0)
    assert w.lm_head is w.embed
    with pytest.raises(ValueError, match="same array"):
        Weights(cfg, w.embed, w.layers, w.final_norm, w.embed.copy())
    with pytest.raises(ValueError, match="final_norm"):
        Weights(cfg, w.embed, w.layers, w.final_norm.astype(np.float32), w.embed)


@pytest.mark.parametrize("tied", [False, True])
def test_safetensors_round_trip_is_bitwise(tmp_path, tied):
    cfg = ModelConfig.preset("tiny").replace(tie_word_embeddings=tied)
    w = Weights.random(cfg, seed=11)
    w.save_hf(tmp_path)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert ("lm_head.weight" in names) is not tied
    assert "model.layers.1.self_attn.k_proj.weight" in names
    back = Weights.from_hf(tmp_path)
    assert back.cfg == cfg
    assert (back.lm_head is back.embed) is tied
    for name, a in w.arrays().items():
        b = back.arrays()[name]
        assert b.dtype == a.dtype and np.array_equal(a.view(np.uint16), b.view(np.uint16)), name


def test_from_hf_accepts_fp32_and_fp16_and_splits_fused(tmp_path):
    cfg = ModelConfig.preset("tiny")
    w = Weights.random(cfg, seed=2)
    w.save_hf(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    # k_proj is rows q_dim..q_dim+kv_dim of the fused weight; gate rows come before up rows
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.k_proj.weight"], w.layers[0].w_qkv[64:96])
    np.testing.assert_array_equal(tensors["model.layers.0.mlp.up_proj.weight"], w.layers[0].w_gate_up[192:])
    tensors = {n: (a.astype(np.float32) if i % 2 else a.astype(np.float16)) for i, (n, a) in
               enumerate(sorted(tensors.items()))}
    save_file(tensors, tmp_path / "model.safetensors")
    back = Weights.from_hf(tmp_path)
    assert {a.dtype for a in tensors.values()} == {np.dtype(np.float16), np.dtype(np.float32)}
    assert back.layers[0].w_qkv.dtype == ml_dtypes.bfloat16
    for name, a in w.arrays().items():  # fp32 holds bf16 exactly; fp16 rounds, close to it
        np.testing.assert_allclose(back.arrays()[name].astype(np.float32), a.astype(np.float32), rtol=1e-2,
                                   atol=1e-4)


def test_from_hf_reports_missing_and_unknown_tensors(tmp_path):
    cfg = ModelConfig.preset("tiny")
    Weights.random(cfg, seed=2).save_hf(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file(dict(tensors, **{"model.layers.0.self_attn.q_proj.bias": tensors["model.norm.weight"]}),
              tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="q_proj.bias"):
        Weights.from_hf(tmp_path)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="down_proj"):
        Weights.from_hf(tmp_path)


def test_from_hf_checks_each_tensor_before_fusing(tmp_path):
    """q_proj 16 rows too tall and k_proj 16 rows short fuse to the right [qkv_dim, D]: each part is checked."""
    cfg = ModelConfig.preset("tiny")
    Weights.random(cfg, seed=3).save_hf(tmp_path)
    good = load_file(tmp_path / "model.safetensors")
    q, k = "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"
    moved = dict(good, **{q: np.concatenate([good[q], good[k][:16]]), k: good[k][16:]})
    wrong_k = dict(good, **{"model.layers.0.mlp.down_proj.weight": good["model.layers.0.mlp.down_proj.weight"][:, 8:]})
    for tensors, name, shape in ((moved, "q_proj", r"\(80, 64\), the config says \(64, 64\)"),
                                 (wrong_k, "down_proj", r"\(64, 184\), the config says \(64, 192\)")):
        save_file(tensors, tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=f"{name}.weight' has shape {shape}"):
            Weights.from_hf(tmp_path)
