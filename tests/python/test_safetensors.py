"""mhsa's safetensors reader and writer against the real `safetensors` package (PyPI).

Files written by either side are read by the other, for F32, F16 and BF16 and odd shapes. Every
corrupted variant of a valid file (truncated, header length too large, overlapping and
out-of-range offsets, unknown dtype, shape/size mismatch, non-UTF-8 and non-JSON headers, a
missing tensor) must give mhsa.Error naming the problem, and never crash.
"""

import errno
import json
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

import mhsa


def valid_file(rng, path):
    tensors = {"wte": rng.standard_normal((11, 8), dtype=np.float32),
               "h.0.attn.c_attn.weight": rng.standard_normal((8, 24), dtype=np.float32),
               "bias": rng.standard_normal(5, dtype=np.float32), "empty": np.zeros((0, 3), np.float32)}
    save_file(tensors, str(path), metadata={"format": "np"})
    return tensors


def test_reads_files_written_by_safetensors(rng, tmp_path):
    want = valid_file(rng, tmp_path / "a.safetensors")
    got = mhsa.load_safetensors(str(tmp_path / "a.safetensors"))
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reads_half_precision(rng, tmp_path, dtype):
    t = torch.from_numpy(rng.standard_normal((7, 13), dtype=np.float32) * 100).to(dtype)
    t[0, :4] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0])
    t[1, 0] = 1e-6  # subnormal in F16
    torch_save_file({"x": t}, str(tmp_path / "h.safetensors"))
    got = mhsa.load_safetensors(str(tmp_path / "h.safetensors"))["x"]
    np.testing.assert_array_equal(got, t.float().numpy())


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_files_it_writes_read_back_everywhere(rng, tmp_path, dtype):
    x = rng.standard_normal((3, 4, 5), dtype=np.float32)
    strided = rng.standard_normal((6, 9), dtype=np.float32)[::2, ::3]
    path = str(tmp_path / "out.safetensors")
    mhsa.save_safetensors(path, {"x": x, "strided": strided}, metadata={"step": "7"}, dtype=dtype)
    # NumPy has no bfloat16: the torch loader reads that one.
    theirs = load_file(path) if dtype != "BF16" else {k: v.float().numpy() for k, v in torch_load_file(path).items()}
    ours = mhsa.load_safetensors(path)
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    for name, value in {"x": x, "strided": strided}.items():
        rounded = torch.from_numpy(np.ascontiguousarray(value)).to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(np.asarray(theirs[name], np.float32), rounded)
        np.testing.assert_array_equal(ours[name], rounded)


def corrupt(raw, header_edit=None, length=None, data=None, header_bytes=None):
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    if header_edit:
        header_edit(header)
    body = header_bytes if header_bytes is not None else json.dumps(header).encode()
    rest = raw[8 + n:] if data is None else data
    return struct.pack("<Q", len(body) if length is None else length) + body + rest


def set_(name, key, value):
    def edit(h):
        h[name][key] = value
    return edit


VARIANTS = {
    "truncated-length": (lambda raw: raw[:5], "header length: expected 8 bytes, got 5 bytes"),
    "truncated-data": (lambda raw: raw[:-7], "data_offsets: expected 0 <= begin <= end <="),
    "header-too-long": (lambda raw: corrupt(raw, length=10 ** 9), "header length: expected at most"),
    "not-json": (lambda raw: corrupt(raw, header_bytes=b"{\"wte\": [1, 2"), "header: expected UTF-8 JSON"),
    "not-utf8": (lambda raw: corrupt(raw, header_bytes=b"{\"w\xff\xfe\": 1}"), "header: expected UTF-8 JSON"),
    "not-object": (lambda raw: corrupt(raw, header_bytes=b"[1, 2, 3]"), "header: expected a JSON object"),
    "unknown-dtype": (lambda raw: corrupt(raw, set_("bias", "dtype", "I64")), "tensor 'bias' dtype: expected F32, F16 or BF16, got I64"),
    "shape-size-mismatch": (lambda raw: corrupt(raw, set_("bias", "shape", [6])), "tensor 'bias' data_offsets: expected 24 bytes"),
    "negative-size": (lambda raw: corrupt(raw, set_("bias", "shape", [-5])), "tensor 'bias' shape: expected a non-negative integer, got -5"),
    "huge-shape": (lambda raw: corrupt(raw, set_("bias", "shape", [2 ** 40, 2 ** 40])), "tensor 'bias' shape: expected a size within"),
    "out-of-range": (lambda raw: corrupt(raw, set_("bias", "data_offsets", [0, 10 ** 12])), "tensor 'bias' data_offsets: expected 0 <= begin <= end"),
    "reversed-offsets": (lambda raw: corrupt(raw, set_("bias", "data_offsets", [20, 0])), "tensor 'bias' data_offsets"),
    "missing-offsets": (lambda raw: corrupt(raw, lambda h: h["bias"].pop("data_offsets")), "tensor 'bias': expected a 'data_offsets' entry, got none"),
    "bad-metadata": (lambda raw: corrupt(raw, lambda h: h.update(__metadata__={"a": 1})), "__metadata__ 'a': expected a string, got 1"),
}


def overlapping(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h["bias"]["data_offsets"] = [h["wte"]["data_offsets"][0] + 4, h["wte"]["data_offsets"][0] + 24]
    return corrupt(raw, lambda hh: hh.update(bias=h["bias"]))


VARIANTS["overlapping"] = (overlapping, "data_offsets: expected bytes apart from tensor")


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_corrupted_files_give_clear_errors(rng, tmp_path, variant):
    make, message = variant
    valid_file(rng, tmp_path / "ok.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(make((tmp_path / "ok.safetensors").read_bytes()))
    with pytest.raises(mhsa.Error, match=message.replace("[", r"\[").replace("(", r"\(")):
        mhsa.load_safetensors(str(bad))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(mhsa.Error, match="path: expected a readable file, got '.*nope': No such file"):
        mhsa.load_safetensors(str(tmp_path / "nope"))
    with pytest.raises(mhsa.Error, match="path: expected a regular file"):
        mhsa.load_safetensors(str(tmp_path))


def test_failed_write_leaves_the_old_file(rng, tmp_path):
    path = tmp_path / "keep.safetensors"
    mhsa.save_safetensors(str(path), {"a": np.ones(3, np.float32)})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="tensor 'b': expected dtype float32"):
        mhsa.save_safetensors(str(path), {"a": np.ones(3, np.float32), "b": np.ones(3)})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.safetensors"]


def test_a_file_that_cannot_be_written_is_a_write_error(tmp_path):
    """mhsa.WriteError (an mhsa.Error, so a ValueError) with the system's errno, as an OSError has it."""
    missing = tmp_path / "no-such-dir" / "x.safetensors"
    with pytest.raises(mhsa.WriteError, match=f"expected a writable location, got '{missing}'") as e:
        mhsa.save_safetensors(str(missing), {"a": np.ones(3, np.float32)})
    assert e.value.errno == errno.ENOENT and isinstance(e.value, mhsa.Error) and isinstance(e.value, ValueError)
    with pytest.raises(mhsa.Error) as e:  # a bad argument is no WriteError
        mhsa.save_safetensors(str(tmp_path / "x.safetensors"), {"a": np.ones(3)})
    assert not isinstance(e.value, mhsa.WriteError)


# ---- sharded checkpoints: model.safetensors.index.json ----------------------------------------


def test_reads_checkpoints_sharded_by_transformers(rng, tmp_path):
    """A tiny Llama written by transformers' save_pretrained in several shards reads back whole."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=int(rng.integers(50, 90)), hidden_size=24, intermediate_size=37,
                                   num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                                   tie_word_embeddings=False)
    torch.manual_seed(int(rng.integers(2**31)))
    model = transformers.LlamaForCausalLM(cfg).float()
    model.save_pretrained(tmp_path, max_shard_size="8KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (tmp_path / "model.safetensors").exists()
    want = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for got in (mhsa.load_checkpoint(tmp_path), mhsa.load_checkpoint(tmp_path / "model.safetensors.index.json")):
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def write_shards(rng, d, shards=3):
    weight_map, tensors = {}, {}
    for i in range(shards * 2):
        name = f"layers.{i}.weight"
        tensors[name] = rng.standard_normal((int(rng.integers(1, 6)), 3), dtype=np.float32)
        weight_map[name] = f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors"
    for shard in set(weight_map.values()):
        save_file({k: v for k, v in tensors.items() if weight_map[k] == shard}, str(d / shard))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map, tensors


@pytest.mark.parametrize("shard, message", [
    ("../model-00001-of-00003.safetensors", "the name of a file in the index's directory"),
    ("/etc/passwd", "the name of a file in the index's directory"),
    ("sub/x.safetensors", "the name of a file in the index's directory"),
    ("..", "the name of a file in the index's directory"),
    ("model-00009-of-00009.safetensors", r"\(no such file\)"),
])
def test_refuses_hostile_indexes(rng, tmp_path, shard, message):
    weight_map, _ = write_shards(rng, tmp_path)
    weight_map["layers.0.weight"] = shard
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(mhsa.Error, match=r"safetensors index .*model.safetensors.index.json: weight_map "
                                         r"'layers.0.weight': expected .*" + message):
        mhsa.load_checkpoint(tmp_path)


def test_refuses_indexes_that_disagree_with_their_shards(rng, tmp_path):
    weight_map, tensors = write_shards(rng, tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    save_file({"layers.0.weight": tensors["layers.0.weight"]}, str(tmp_path / "copy.safetensors"))
    index.write_text(json.dumps({"weight_map": {**weight_map, "other": "copy.safetensors"}}))
    with pytest.raises(mhsa.Error, match="tensor 'layers.0.weight': expected one shard holding it, got two"):
        mhsa.load_checkpoint(tmp_path)
    index.write_text(json.dumps({"weight_map": {**weight_map, "lm_head.weight": weight_map["layers.0.weight"]}}))
    with pytest.raises(mhsa.Error, match="weight_map 'lm_head.weight': expected a tensor of shard"):
        mhsa.load_checkpoint(tmp_path)
    index.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(mhsa.Error, match="weight_map: expected a non-empty object"):
        mhsa.load_checkpoint(tmp_path)
    with open(index, "wb") as f:  # too large to read: refused before reading (a sparse file)
        f.truncate(1 << 40)
    with pytest.raises(mhsa.Error, match="file size: expected at most"):
        mhsa.load_checkpoint(tmp_path)
    with pytest.raises(mhsa.Error, match=r"expected a directory, got '.*absent' \(no such directory\)"):
        mhsa.load_checkpoint(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(mhsa.Error, match="a directory holding model.safetensors or model.safetensors.index.json"):
        mhsa.load_checkpoint(tmp_path / "empty")
