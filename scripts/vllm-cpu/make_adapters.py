"""Make deterministic random LoRA adapters for the converted model.

    python make_adapters.py --model DIR --out DIR

Writes OUT/smol-lora (seed 1) and OUT/smol-lora-b (seed 2), peft adapters with
LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]). They are siblings
in one folder, so a container can mount that folder at /adapters and load either one
at run time.

peft starts B at zero, which makes a fresh adapter a no-op. So A and B are both drawn
from a generator seeded with the adapter's seed (in the sorted order of the parameter
names, independent of peft's own initialisation): A ~ N(0, 1/in_features) as in a
Kaiming-like init, B ~ N(0, B_STD²). B_STD is large enough to change greedy output and
small enough to keep it text (at 0.2 the answers turn into repetition, at 0.4 into
noise). The same seed gives byte-identical files; the script checks that each adapter
changes the model's greedy answer to a fixed prompt and fails if not.
"""

import argparse
import json
import math
import os

ADAPTERS = (("smol-lora", 1), ("smol-lora-b", 2))
B_STD = 0.1
# What a container sees: pruefstand mounts the model at /model.
BASE_MODEL_PATH = "/model"


def make_adapter(model_dir, out_dir, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
        target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                fan_in = param.shape[1]
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
            elif ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * B_STD)
    peft_model.save_pretrained(out_dir)
    # Name the base model as a container sees it, not as this build saw it; drop peft's
    # model card, which holds nothing but that path and version numbers.
    config_path = os.path.join(out_dir, "adapter_config.json")
    with open(config_path, encoding="utf-8") as f:
        adapter_config = json.load(f)
    adapter_config["base_model_name_or_path"] = BASE_MODEL_PATH
    # peft keeps target_modules as a set: its order in the file follows Python's hash
    # seed, which would make the same adapter differ from run to run.
    if isinstance(adapter_config.get("target_modules"), list):
        adapter_config["target_modules"] = sorted(adapter_config["target_modules"])
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(out_dir, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    return peft_model


def greedy(model, tokenizer, prompt):
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    return tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompt = "Write a haiku about the sea."
    base = greedy(AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32), tokenizer, prompt)
    print(f"make_adapters: base        {base!r}", flush=True)
    for name, seed in ADAPTERS:
        model = make_adapter(args.model, os.path.join(args.out, name), seed)
        answer = greedy(model, tokenizer, prompt)
        print(f"make_adapters: {name:<11} {answer!r} (seed {seed})", flush=True)
        if answer == base:
            raise SystemExit(f"make_adapters: {name} does not change the model's answer")


if __name__ == "__main__":
    main()
