"""Online training (`kind: grpo`): TRL's GRPOTrainer with a PEFT LoRA, its rewards from
pruefstand's environment (`python -m pruefstand_env serve`, on the host), the updated
adapter loaded into the policy's running vLLM after every step (docs/training.md,
"An environment a trainer steps").

One step:

1. TRL generates `num_generations` first turns of a prompt (its own sampling, the
   weights being trained) from a case's first prompt — AgentDojo's system message and
   the user's task with the suite's tools — rendered with the **served** chat template
   and checked token for token against the server's `/tokenize`, then `prefix` (text the
   turn begins with, given: e.g. `<tool_call>\\n{"name": "` makes it a tool call, for a
   model that never calls one on its own). Cases whose first prompt is the same — a
   clean case and its attacked twins — are one prompt, its completions spread over them
   in turn (the injection only arrives in a tool result: the policy cannot tell them
   apart at its first turn).
2. The reward function hands each completion (prefix + text) to the environment, which
   plays the rest of the episode through the gym with every later turn answered by the
   vLLM server under the adapter of the last step, and returns the rubric's agent
   reward — or null for a rollout that errored after its retries: TRL takes null as "no
   reward" (the completion carries no learning signal), never as 0.
3. After the optimizer step the adapter is written to `live/step-N/adapter` (a folder
   the server sees at `/adapters`) and loaded into the server at run time
   (`POST /v1/load_lora_adapter`, name `<adapter_name>-step-N`): the next step's later
   turns are the new policy's. The initial adapter (LoRA B is zero: the base model's
   outputs) is loaded as step 0 before the first step.

Events (stdout, as train.py's): `online` (cases, prompt tokens, checked), `adapter`
(each adapter loaded), `rollouts` (a step's rewards, errors, spread), `start`, `step`
(with `reward_mean`, `reward_std`, `adapter`), `done`. No checkpoints: an interrupted
online training starts again from step 0 (its rollouts are not replayable).

Not here: the environment (scripts/pruefstand_env), the request (request.py).
"""

import json
import math
import os
import statistics
import time
import types
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from . import events
from .request import Refused


def _http(url, body=None, key=None, timeout=1800):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class Policy:
    """The policy's vLLM server: where its adapters are loaded and which one the
    environment's later turns use now."""

    def __init__(self, online, print_):
        self.url = online["policy_url"].rstrip("/")
        self.base = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        self.name = online["adapter_name"]
        self.live = online["live_dir"]
        self.live_server = online["live_dir_server"].rstrip("/")
        self.key = os.environ.get("PRUEFSTAND_TOKENIZE_KEY") or None
        self.current = None
        self.loaded = []
        self.print = print_

    def publish(self, model, request, step):
        """Writes the adapter of STEP where the server sees it and loads it there."""
        from . import train

        folder = os.path.join(self.live, f"step-{step}")
        target = types.SimpleNamespace(out=folder, adapter=os.path.join(folder, "adapter"),
                                       base_model_name=request.base_model_name)
        path, digests = train.write_adapter(target, model.save_pretrained)
        name = f"{self.name}-step-{step}"
        t0 = time.monotonic()
        try:
            answer = _http(self.base + "/v1/load_lora_adapter",
                           {"lora_name": name, "lora_path": f"{self.live_server}/step-{step}/adapter"}, self.key, 600)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"the server refused adapter {name}: {e.code} {e.read()[:300]!r}") from None
        models = _http(self.base + "/v1/models", None, self.key, 60)
        served = [m.get("id") for m in (models.get("data") or [])] if isinstance(models, dict) else []
        if name not in served:
            raise RuntimeError(f"adapter {name} loaded ({answer!r}) but the server's /v1/models lists {served}")
        self.current = name
        self.loaded.append(name)
        events.emit("adapter", step=step, name=name, path=path, sha256=digests,
                    load_seconds=round(time.monotonic() - t0, 3), served=served)
        self.print(f"adapter {name} loaded into the server ({answer if isinstance(answer, str) else 'ok'})")


def _check_prompts(tokenizer, cases, texts, online):
    """Our token ids of each case's prompt must be the server's (`/tokenize` with the same
    messages and tools, its own template): the completion is generated after exactly
    the tokens the server would show."""
    from .server import Tokenize

    tokenize = Tokenize(online["policy_url"].rstrip("/").removesuffix("/v1") + "/tokenize", online["served_model"])
    for case, text in zip(cases, texts):
        ours = tokenizer(text, add_special_tokens=False)["input_ids"]
        theirs, error = tokenize.ids(case["messages"], case["tools"], True)
        if error is not None:
            raise Refused(f"case {case['id']}: the server would not render its prompt: {error}")
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            raise Refused(f"case {case['id']}: the prompt's token {at} differs from the server's /tokenize")
    return tokenize.calls


def run(request, print_):
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer

    from . import rows as rows_mod
    from . import train

    online = request.online
    tokenizer, template = rows_mod.load_tokenizer(request.base_model, request.chat_template)
    try:
        offered = _http(online["env_url"].rstrip("/") + "/dataset", None, None, 300)
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(f"cannot reach the environment at {online['env_url']}: {e}") from None
    cases = offered["cases"]
    if online.get("cases"):
        wanted = set(online["cases"])
        cases = [c for c in cases if c["id"] in wanted]
        missing = wanted - {c["id"] for c in cases}
        if missing:
            raise Refused(f"case {sorted(missing)[0]} is not in the environment's dataset")
    if not cases:
        raise Refused("the environment offers no case")
    texts = [tokenizer.apply_chat_template(c["messages"], tools=c["tools"], chat_template=template,
                                           add_generation_prompt=True, tokenize=False) for c in cases]
    checked = _check_prompts(tokenizer, cases, texts, online)
    prefix = online["prefix"]
    generations = online["num_generations"]
    per_step = online["prompts_per_step"]
    prompt_tokens = [len(tokenizer(t + prefix, add_special_tokens=False)["input_ids"]) for t in texts]
    events.emit("online", cases=len(cases), prompt_tokens=prompt_tokens, checked=checked,
                manifest=offered.get("manifest"))
    print_(f"{len(cases)} case(s), prompts of {min(prompt_tokens)}–{max(prompt_tokens)} tokens, matched the server's /tokenize")

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    set_seed(request.seed)
    model = AutoModelForCausalLM.from_pretrained(request.base_model, dtype=torch.bfloat16 if bf16 else torch.float32)
    lora = LoraConfig(r=request.lora_r, lora_alpha=request.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    policy = Policy(online, print_)
    policy.publish(model, request, 0)

    config = GRPOConfig(
        output_dir=request.checkpoints,
        max_steps=request.steps,
        per_device_train_batch_size=generations * per_step,
        gradient_accumulation_steps=1,
        num_generations=generations,
        max_completion_length=online["max_completion_length"],
        temperature=online["temperature"],
        learning_rate=request.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        seed=request.seed,
        data_seed=request.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=bf16,
        use_cpu=not cuda,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    # Cases whose first prompt is the same text — a clean case and its attacked twins:
    # the injection arrives later, in a tool result — are one prompt of the dataset, and
    # its group's completions are spread over them in turn. The policy cannot tell them
    # apart at its first turn; whether an injection comes is the environment's draw, so
    # the group's mean reward is the prompt's expected reward over its twins.
    twins = {}
    for c, t in zip(cases, texts):
        twins.setdefault(t, []).append(c["id"])
    if generations % max(len(ids) for ids in twins.values()):
        raise Refused(
            f"num_generations {generations} does not spread evenly over the "
            f"{max(len(ids) for ids in twins.values())} cases that share a first prompt"
        )
    dataset = Dataset.from_list([{"prompt": t + prefix, "cases": ids} for t, ids in twins.items()])
    env_url = online["env_url"].rstrip("/") + "/rollout"
    tally = {"rollouts": 0, "errors": 0, "seconds": 0.0}
    step_rewards = {}

    def agent(prompts, completions, cases, trainer_state=None, **_):
        """The environment's agent reward of each completion's episode; None when the
        rollout errored (after the environment's retries)."""
        step = (trainer_state.global_step if trainer_state is not None else 0) + 1
        adapter = policy.current
        # Groups are consecutive blocks of `generations` completions of one prompt.
        case = [ids[(i % generations) % len(ids)] for i, ids in enumerate(cases)]
        t0 = time.monotonic()

        def one(item):
            case_id, text = item
            try:
                return _http(env_url, {"case": case_id, "completion": prefix + text, "model": adapter,
                                       "base_url": policy.url})
            except (urllib.error.URLError, OSError, ValueError) as e:
                return {"reward": None, "error": f"the environment: {e}", "attempts": 0, "turns": 0}

        with ThreadPoolExecutor(max_workers=len(completions)) as pool:
            results = list(pool.map(one, zip(case, completions)))
        rewards = [r.get("reward") for r in results]
        scored = [r for r in rewards if r is not None]
        errors = sum(1 for r in rewards if r is None)
        seconds = time.monotonic() - t0
        tally["rollouts"] += len(rewards)
        tally["errors"] += errors
        tally["seconds"] += seconds
        spread = statistics.pstdev(scored) if len(scored) > 1 else 0.0
        step_rewards[step] = rewards
        events.emit("rollouts", step=step, adapter=adapter, cases=sorted(set(case)), rewards=rewards, errors=errors,
                    retried=sum(max(0, (r.get("attempts") or 1) - 1) for r in results), spread=round(spread, 6),
                    turns=[r.get("turns") for r in results], seconds=round(seconds, 3),
                    first_calls=[[c.get("function") for c in (r.get("first_reply") or {}).get("tool_calls") or []]
                                 for r in results])
        return rewards

    class Progress(TrainerCallback):
        def __init__(self):
            self.began = None
            self.reported = set()

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            policy.publish(model, request, state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            step = state.global_step
            if not logs or "loss" not in logs or step in self.reported:
                return
            self.reported.add(step)
            seconds = time.monotonic() - self.began if self.began is not None else None
            loss = logs.get("loss")
            loss = loss if isinstance(loss, (int, float)) and math.isfinite(loss) else None
            events.emit("step", step=step, steps=request.steps, loss=loss,
                        seconds=round(seconds, 3) if seconds else seconds,
                        reward_mean=logs.get("reward"), reward_std=logs.get("reward_std"), adapter=policy.current)

    trainer = GRPOTrainer(model=model, reward_funcs=[agent], args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.add_callback(Progress())
    events.emit("start", steps=request.steps, resumed_from=0)
    trainer.train()
    print_(f"rollouts: {tally['rollouts']}, errored (no reward): {tally['errors']}, {tally['seconds']:.1f} s")
    train.finish(request, trainer.model.save_pretrained, trainer.state.log_history, len(cases))
