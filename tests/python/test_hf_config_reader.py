"""Bad inputs to scripts/import_hf.py's readers (scripts/hf_interop.py), numpy only:
- the config.json reader, table-driven: each wrong JSON type or out-of-range value is an HFError that names
  the file and the key; and a sweep that gives every key of a valid GPT-2 and Llama config each of a set
  of junk values and accepts only a config or an HFError (never another exception: a traceback);
- the folder reader: a config.json that is not an object, an index that is not JSON or has no weight_map;
- non-finite weights (a NaN in GPT-2's wte, +inf in a Llama norm) refused at import, naming the tensor;
- import_hf.py on each of those: one `error: FILE: what is wrong` line on stderr and exit 1.
Run: python3 -m pytest -q tests/python/test_hf_config_reader.py"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hf_interop  # noqa: E402
from test_hf_interop import llama_hc, random_model  # noqa: E402


def gpt2_hc(**changes):
    hc = dict(model_type="gpt2", vocab_size=50, n_embd=32, n_head=2, n_layer=1, n_positions=16)
    hc.update(changes)
    return hc


@pytest.mark.parametrize("hc, message", [
    (llama_hc(hidden_size="32"), "hidden_size = '32' is not an integer in [1, 2^31)"),
    (llama_hc(num_attention_heads=0), "num_attention_heads = 0 is not an integer in [1, 2^31)"),
    (llama_hc(num_key_value_heads=2.0), "num_key_value_heads = 2.0 is not an integer"),
    (llama_hc(num_hidden_layers=True), "num_hidden_layers = True is not an integer"),
    (llama_hc(intermediate_size=-48), "intermediate_size = -48 is not an integer"),
    (llama_hc(vocab_size=[100]), "vocab_size = [100] is not an integer"),
    (llama_hc(num_hidden_layers=5000), "num_layers 5000 must be an integer in [1, 1024]"),
    (llama_hc(rms_norm_eps="1e-5"), "rms_norm_eps = '1e-5' is not a finite number"),
    (llama_hc(rms_norm_eps=-1e-5), "rms_norm_eps -1e-05 must be in (0, 1)"),
    (llama_hc(rope_theta=float("nan")), "rope_theta = nan is not a finite number"),
    (llama_hc(rope_theta=0.5), "RoPE needs theta in (1, 1e12)"),
    (llama_hc(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}),
     "rope_parameters rope_theta = '1e4' is not a finite number"),
    (llama_hc(tie_word_embeddings="yes"), "tie_word_embeddings = 'yes' is not true or false"),
    (llama_hc(model_type=["llama"]), "model_type = ['llama'] is not a string"),
    (llama_hc(hidden_act=1), "hidden_act = 1 is not a string"),
    (llama_hc(model_type="qwen2", layer_types="full_attention"), "layer_types = 'full_attention' is not a list"),
    (llama_hc(model_type="mistral", sliding_window=-1), "sliding_window = -1 is not an integer in [0, 2^31)"),
    (gpt2_hc(n_embd="32"), "n_embd = '32' is not an integer"),
    (gpt2_hc(n_head=0), "n_head = 0 is not an integer"),
    (gpt2_hc(layer_norm_epsilon="1e-5"), "layer_norm_epsilon = '1e-5' is not a finite number"),
    (gpt2_hc(scale_attn_weights=1), "scale_attn_weights = 1 is not true or false"),
], ids=["hidden_size_string", "heads_zero", "kv_heads_float", "layers_bool", "mlp_negative", "vocab_list",
        "layers_too_many", "eps_string", "eps_negative", "theta_nan", "theta_small", "rope_parameters_theta_string",
        "tie_string", "model_type_list", "hidden_act_number", "layer_types_string", "sliding_window_negative",
        "gpt2_n_embd_string", "gpt2_heads_zero", "gpt2_eps_string", "gpt2_flag_number"])
def test_config_reader_refuses(hc, message):
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.config_from_hf(hc, "x/config.json")
    assert str(e.value).startswith("x/config.json: ") and message in str(e.value), str(e.value)


JUNK = [None, "7", "", [], [3], {}, {"a": 1}, True, False, 0, -1, 1.5, 2 ** 40, float("nan"), float("inf"), 1e300]


@pytest.mark.parametrize("base", [gpt2_hc(n_inner=64, tie_word_embeddings=False),
                                  llama_hc(head_dim=8, rope_scaling=dict(rope_type="llama3", factor=8.0,
                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))], ids=["gpt2", "llama"])
def test_config_reader_sweep_gives_a_config_or_an_hf_error(base):
    """Every key of a valid config replaced by each junk value (and removed): a config or an HFError."""
    assert hf_interop.config_from_hf(base, "x/config.json")
    for key in list(base) + ["model_type"]:
        for value in JUNK + ["absent"]:
            hc = {k: v for k, v in base.items() if k != key}
            if value != "absent":
                hc[key] = value
            try:
                hf_interop.config_from_hf(hc, "x/config.json")
            except hf_interop.HFError as e:
                assert str(e).startswith("x/config.json: "), str(e)
            except Exception as e:  # noqa: BLE001: any other exception is the finding
                pytest.fail(f"{key} = {value!r}: {type(e).__name__}: {e}")


def hf_folder(d, name="llama_mha_tied", poison=None, value=np.nan):
    """Writes random_model(name) as a Hugging Face folder in d; `poison`: a tensor given one `value`."""
    cfg, flat = random_model(name)
    hf_interop.export_hf_dir(d, cfg, flat)
    if poison:
        t = hf_interop.read_safetensors(os.path.join(d, "model.safetensors"))
        t = {k: np.array(v) for k, v in t.items()}
        t[poison].flat[3] = value
        hf_interop.write_safetensors(os.path.join(d, "model.safetensors"), t)
    return d


@pytest.mark.parametrize("name, tensor, value", [
    ("gpt2_tied", "transformer.wte.weight", np.nan),
    ("llama_mha_tied", "model.norm.weight", np.inf),
    ("llama_gqa_untied", "model.layers.1.self_attn.k_proj.weight", -np.inf),
])
def test_import_refuses_nonfinite_weights(tmp_path, name, tensor, value):
    d = hf_folder(str(tmp_path), name, tensor, value)
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.import_hf_dir(d)
    assert f"tensor {tensor} holds 1 values that are not finite (NaN or inf), the first at flat index 3" in str(e.value)


def run_import(d, out):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "import_hf.py"), str(d), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def shard_folder(d, index_text):
    """A sharded folder: the single file renamed to a shard, and index_text as model.safetensors.index.json."""
    hf_folder(d)
    os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "model-00001-of-00001.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write(index_text)


def safetensors_header(d, header):
    """A folder whose model.safetensors holds `header` as its JSON header and 8 bytes of data."""
    hf_folder(d)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + bytes(8))


@pytest.mark.parametrize("make, file, message", [
    (lambda d: open(os.path.join(hf_folder(d), "config.json"), "w").write("[1, 2]"), "config.json",
     "holds an array, not a JSON object"),
    (lambda d: open(os.path.join(hf_folder(d), "config.json"), "w").write(json.dumps(llama_hc(hidden_size="32"))),
     "config.json", "hidden_size = '32' is not an integer"),
    (lambda d: open(os.path.join(hf_folder(d), "config.json"), "wb").write(b'{"model_type": "\xff"}'),
     "config.json", "not JSON"),
    (lambda d: shard_folder(d, "{not json"), "model.safetensors.index.json", "not JSON"),
    (lambda d: shard_folder(d, '{"weight_map": ["model-00001-of-00001.safetensors"]}'),
     "model.safetensors.index.json", "no weight_map object"),
    (lambda d: hf_folder(d, "gpt2_tied", "transformer.wte.weight", np.nan), "",
     "tensor transformer.wte.weight holds 1 values that are not finite"),
    (lambda d: hf_folder(d, "llama_mha_tied", "model.norm.weight", np.inf), "",
     "tensor model.norm.weight holds 1 values that are not finite"),
    (lambda d: safetensors_header(d, b"[1, 2]"), "model.safetensors", "its JSON header is not an object"),
    (lambda d: safetensors_header(d, b'{"w": {"shape": [2], "data_offsets": [0, 8]}}'), "model.safetensors",
     "tensor w: its header entry is not {dtype, shape: [sizes], data_offsets: [start, end]}"),
    (lambda d: safetensors_header(d, b'{"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}'),
     "model.safetensors", "tensor w: its header entry is not"),
], ids=["config_list", "hidden_size_string", "config_not_utf8", "index_not_json", "index_weight_map_list",
        "gpt2_nan", "llama_norm_inf", "safetensors_header_list", "safetensors_no_dtype", "safetensors_shape_string"])
def test_import_script_bad_folder_is_one_line(tmp_path, make, file, message):
    d = tmp_path / "hf"
    d.mkdir()
    make(str(d))
    p = run_import(d, tmp_path / "m.bin")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    where = os.path.join(str(d), file) if file else str(d)
    assert lines[0].startswith(f"error: {where}: ") and message in lines[0], lines[0]
    assert not (tmp_path / "m.bin").exists(), "nothing is written for a refused folder"
