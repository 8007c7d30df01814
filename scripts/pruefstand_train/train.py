"""The training itself: a PEFT LoRA (all linear layers, no dropout) on the base model,
trained with TRL's DPOTrainer or SFTTrainer on the rows' token ids as rows.py made them
(and the server confirmed), seeded, checkpointed every step, resumed from the last
complete checkpoint, the adapter written atomically.

Checkpoints. TRL/transformers write `checkpoint-N` every step (the adapter, optimizer,
scheduler, RNG states, trainer state; the three newest kept). A checkpoint counts once
this module has synced its files and written `pruefstand-step.json` into it; only
then is step N's event emitted. So an event means the step is durable: a run killed
at any moment resumes from the newest marked checkpoint (unmarked ones, cut off
mid-write, are removed), and no step that was reported is run again.
`pruefstand-request.json` beside the checkpoints holds what they were made by (the
hyperparameters and the sha256 of the rows and template); checkpoints of another
request are refused, not resumed.

Determinism: same request, same seed, `PYTHONHASHSEED=0` → the same adapter bytes and
losses, resumed or not (measured on CPU; docs/training.md). The seed is set before the
LoRA's weights are drawn (TRL wraps the model before the Trainer seeds); dropout is 0.

Not here: rendering and checking rows (rows.py, server.py), the request (request.py).
"""

import glob
import hashlib
import json
import math
import os
import re
import shutil
import time

from . import events
from .request import Refused

MARKER = "pruefstand-step.json"
FINGERPRINT = "pruefstand-request.json"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(request):
    data = request.fingerprint()
    data["rows"] = [sha256_file(p) for p in request.rows]
    data["chat_template"] = sha256_file(request.chat_template) if request.chat_template else None
    config = os.path.join(request.base_model, "config.json")
    data["base_model_config"] = sha256_file(config) if os.path.isfile(config) else None
    return data


def _fsync_tree(path):
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path, data):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _checkpoints(folder):
    """{step: path} of every checkpoint-N folder."""
    found = {}
    for path in glob.glob(os.path.join(folder, "checkpoint-*")):
        m = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(path))
        if m and os.path.isdir(path):
            found[int(m.group(1))] = path
    return found


def _marked(path, step):
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            return json.load(f).get("step") == step
    except (OSError, ValueError):
        return False


def last_checkpoint(request, print_):
    """The newest complete checkpoint's (step, path), or (0, None); removes incomplete
    ones and refuses checkpoints made by another request."""
    folder = request.checkpoints
    os.makedirs(folder, exist_ok=True)
    mine = fingerprint(request)
    found = _checkpoints(folder)
    complete = {step: path for step, path in found.items() if _marked(path, step)}
    for step, path in sorted(found.items()):
        if step not in complete:
            print_(f"removing the incomplete checkpoint {path} (cut off while being written)")
            shutil.rmtree(path)
    fp_path = os.path.join(folder, FINGERPRINT)
    if complete:
        try:
            with open(fp_path, encoding="utf-8") as f:
                theirs = json.load(f)
        except (OSError, ValueError):
            theirs = None
        if theirs != mine:
            differs = "unknown" if not isinstance(theirs, dict) else next(
                (k for k in sorted(mine) if theirs.get(k) != mine[k]), "unknown"
            )
            raise Refused(
                f"the checkpoints in {folder} were made by another request ({'no ' + FINGERPRINT if theirs is None else 'field `' + differs + '` differs'}); "
                "remove them to train afresh"
            )
        step = max(complete)
        if step > request.steps:
            raise Refused(f"the checkpoints in {folder} go to step {step}, past the request's {request.steps} steps")
        return step, complete[step]
    _write_json_atomic(fp_path, mine)
    return 0, None


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def dataset_rows(request, rows):
    """The training examples, and how many rows fit max_length. DPO: a row whose prompt
    alone fills max_length is left out (TRL truncates the rest at the end, keeping the
    prompt whole). SFT: a conversation is cut at max_length and left out when no token
    of an assistant turn is left."""
    examples = []
    for row in rows:
        ids = row.ids
        if request.kind == "dpo":
            if len(ids["prompt_ids"]) >= request.max_length:
                continue
            examples.append({k: ids[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")})
        else:
            input_ids = ids["input_ids"][: request.max_length]
            mask = ids["assistant_mask"][: request.max_length]
            if not any(mask):
                continue
            examples.append({"input_ids": input_ids, "assistant_masks": mask})
    return examples


def run(request, rows, tokenizer, template, print_):
    """Trains on ROWS (tokenised and checked) and writes the adapter; emits start, step
    and done."""
    examples = dataset_rows(request, rows)
    if not examples:
        raise Refused(f"no rows: none of the {len(rows)} rows fits max_length {request.max_length} tokens")
    resumed_from, checkpoint = last_checkpoint(request, print_)
    if resumed_from == request.steps:
        # Every step is done (a run killed after its last checkpoint, or run again):
        # the last checkpoint's adapter is the adapter. TRL would run one step more.
        events.emit("start", steps=request.steps, resumed_from=resumed_from)
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            history = json.load(f).get("log_history", [])
        finish(request, lambda tmp: _copy_adapter(checkpoint, tmp), history, len(examples))
        return

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback, set_seed

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    set_seed(request.seed)
    model = AutoModelForCausalLM.from_pretrained(request.base_model, dtype=torch.bfloat16 if bf16 else torch.float32)
    lora = LoraConfig(
        r=request.lora_r,
        lora_alpha=request.lora_alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        bias="none",
        task_type="CAUSAL_LM",
    )
    common = dict(
        output_dir=request.checkpoints,
        max_steps=request.steps,
        per_device_train_batch_size=request.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=request.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        seed=request.seed,
        data_seed=request.seed,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=3,
        save_only_model=False,
        report_to="none",
        bf16=bf16,
        use_cpu=not cuda,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_length=request.max_length,
        truncation_mode="keep_start",
    )
    dataset = Dataset.from_list(examples)

    class Progress(TrainerCallback):
        """Loss from the step's log, the step's wall time, and its event once its
        checkpoint is complete."""

        def __init__(self):
            self.began = None
            self.losses = {}

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses[state.global_step] = logs["loss"]

        def on_save(self, args, state, control, **kwargs):
            step = state.global_step
            if step > request.steps:
                raise RuntimeError(f"TRL saved step {step} of {request.steps}")
            path = os.path.join(args.output_dir, f"checkpoint-{step}")
            seconds = time.monotonic() - self.began if self.began is not None else None
            loss = _finite(self.losses.get(step))
            _fsync_tree(path)
            _write_json_atomic(os.path.join(path, MARKER), {"step": step, "loss": loss, "seconds": seconds})
            events.emit("step", step=step, steps=request.steps, loss=loss, seconds=round(seconds, 3) if seconds else seconds)

    if request.kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        class TokenisedDPOTrainer(DPOTrainer):
            """The rows are token ids already, rendered with the served template and
            checked against the server: TRL's own tokenisation (the tokenizer's
            template, its own prompt cut) is skipped."""

            def _prepare_dataset(self, dataset, *args, **kwargs):
                return dataset

        config = DPOConfig(beta=request.beta, precompute_ref_log_probs=False, **common)
        trainer = TokenisedDPOTrainer(
            model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora
        )
    else:
        from trl import SFTConfig, SFTTrainer

        # The dataset holds input_ids and assistant_masks: TRL takes it as processed,
        # makes labels from the mask (-100 elsewhere) and tokenises nothing.
        config = SFTConfig(packing=False, completion_only_loss=False, **common)
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora)
    progress = Progress()
    trainer.add_callback(progress)

    events.emit("start", steps=request.steps, resumed_from=resumed_from)
    trainer.train(resume_from_checkpoint=checkpoint)

    finish(request, trainer.model.save_pretrained, trainer.state.log_history, len(examples))


def _copy_adapter(checkpoint, tmp):
    os.makedirs(tmp)
    for name in ADAPTER_FILES:
        shutil.copyfile(os.path.join(checkpoint, name), os.path.join(tmp, name))


def finish(request, save, log_history, rows_used):
    """Writes the adapter (SAVE writes its files into a folder) and emits done, the
    losses from the trainer's log (the checkpoint's, for steps before a resume)."""
    losses = {}
    for entry in log_history:
        if "loss" in entry and "step" in entry:
            losses[entry["step"]] = _finite(entry["loss"])
    adapter, digests = write_adapter(request, save)
    events.emit(
        "done",
        adapter=adapter,
        sha256=digests,
        losses=[losses.get(step) for step in range(1, request.steps + 1)],
        rows_used=rows_used,
    )


def write_adapter(request, save):
    """Saves the LoRA to OUT/adapter atomically: written and synced in a folder beside
    it, then renamed into place (an adapter already there is moved aside first and
    removed after). adapter_config.json names the base model by the request's
    base_model_name and lists target_modules sorted (PEFT writes a set)."""
    os.makedirs(request.out, exist_ok=True)
    final = request.adapter
    tmp = os.path.join(request.out, f".adapter.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    for name in os.listdir(tmp):
        if name not in ADAPTER_FILES:
            # PEFT's model card (README.md): not read by vLLM, and it carries nothing
            # the training manifest does not.
            path = os.path.join(tmp, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    missing = [n for n in ADAPTER_FILES if not os.path.isfile(os.path.join(tmp, n))]
    if missing:
        raise RuntimeError(f"PEFT wrote no {missing[0]} into {tmp}")
    config_path = os.path.join(tmp, "adapter_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["base_model_name_or_path"] = request.base_model_name
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    # safetensors writes 0600; the server's container may read as another user.
    os.chmod(tmp, 0o755)
    for name in ADAPTER_FILES:
        os.chmod(os.path.join(tmp, name), 0o644)
    _fsync_tree(tmp)
    old = None
    if os.path.lexists(final):
        old = os.path.join(request.out, f".adapter.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(request.out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final, {name: sha256_file(os.path.join(final, name)) for name in ADAPTER_FILES}
