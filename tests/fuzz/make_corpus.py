"""Writes the seed corpus for the safetensors header fuzzer (tests/fuzz/corpus).

Small valid files (as our writer and the Python package lay them out) and one
representative of each way a file can be broken. Rerun after changing the format
code: python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)


def st(header, data=b"", pad=True, length=None):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def all_dtypes():
    """(name, size, begin): one element of each dtype, back to back."""
    out, b = [], 0
    for d, s in [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1),
                 ("U8", 1), ("BOOL", 1), ("F8_E4M3", 1), ("F8_E5M2", 1)]:
        out.append((d, s, b))
        b += s
    return out


W4 = st({"w": t("F32", [4], 0, 16)}, bytes(16))  # header of 56 bytes (one space of padding)

seeds = {
    "valid_f32_2x2": st({"w": t("F32", [2, 2], 0, 16)}, bytes(16)),
    "valid_metadata": st({"__metadata__": {"format": "pt"}, "a": t("BF16", [3], 0, 6), "b": t("I8", [2], 6, 8)}, bytes(8)),
    "valid_scalar_and_empty": st({"s": t("F64", [], 0, 8), "z": t("F16", [0, 4], 8, 8)}, bytes(8)),
    "valid_escaped_name": st(b'{"a\\u00e9\\"\\n\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "valid_all_dtypes": st({d: t(d, [1], b, b + s) for d, s, b in all_dtypes()}, bytes(35)),
    "valid_empty_header": st({}),
    "bad_truncated_length": b"\x10\x00\x00",
    "bad_length_past_end": st({"w": t("F32", [1], 0, 4)}, bytes(4), length=4096),
    "bad_length_huge": struct.pack("<Q", 1 << 62) + b"{}",
    "bad_json": st(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]', bytes(4)),
    "bad_unknown_dtype": st({"w": t("F4", [2], 0, 1)}, bytes(1)),
    "bad_offsets_past_end": st({"w": t("F32", [4], 0, 16)}, bytes(8)),
    "bad_overlap": st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, bytes(12)),
    "bad_size_mismatch": st({"w": t("F32", [3], 0, 8)}, bytes(8)),
    "bad_negative_dim": st(b'{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', bytes(4)),
    "bad_numel_overflow": st({"w": t("F64", [1 << 40, 1 << 40], 0, 8)}, bytes(8)),
    "bad_duplicate": st(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
    # The strict rules (issue 14): exact coverage of the data section, UTF-8 text.
    "valid_utf8_name": st('{"w\u00e9\u20ac\U0001f600\U0010ffff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
                          .encode("utf-8"), b"\x01"),
    "valid_empty_at_edges": st({"z0": t("F32", [0], 0, 0), "a": t("F32", [1], 0, 4), "z1": t("I8", [0, 2], 4, 4)},
                               bytes(4)),
    "bad_header_length_one_short": struct.pack("<Q", 55) + W4[8:],
    "bad_header_length_one_long": struct.pack("<Q", 57) + W4[8:],
    "bad_hole": st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, bytes(12)),
    "bad_leading_gap": st({"b": t("F32", [1], 4, 8)}, bytes(8)),
    "bad_trailing_bytes": st({"a": t("F32", [1], 0, 4)}, bytes(7)),
    "bad_data_without_tensors": st({}, bytes(5)),
    "bad_empty_inside_another": st({"a": t("F32", [2], 0, 8), "e": t("F32", [0], 4, 4)}, bytes(8)),
    "bad_utf8_name": st(b'{"w\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_utf8_overlong": st(b'{"w\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_utf8_surrogate": st(b'{"w\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_utf8_past_max": st(b'{"w\xf4\x90\x80\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_utf8_truncated": st(b'{"w\xf0\x9f\x98":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_utf8_metadata": st(b'{"__metadata__":{"k":"\xe2\x82"}}'),
    "bad_lone_surrogate_escape": st(b'{"w\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "index_bad_utf8": b'{"weight_map":{"a\xfe":"model.safetensors"}}',
    "index_valid": json.dumps({"metadata": {"total_size": 16, "x": [1, {"y": None}]},
                               "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                              "b.weight": "model-00002-of-00002.safetensors"}}).encode(),
    "index_bad_path": json.dumps({"weight_map": {"a": "../etc/passwd"}}).encode(),
    "index_bad_deep": b'{"metadata":' + b"[" * 100 + b"]" * 100 + b',"weight_map":{}}',
}
for name, data in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {here}")
