"""`load_environment(...)`: the environment a trainer loads, in the shape of verifiers'
multi-turn tool environments (a dataset of prompts, a rollout protocol with tools, a
rubric of reward functions) without importing verifiers, plus the plain rollout API a
GRPO trainer calls. docs/training.md, "An environment a trainer steps".

Why no verifiers import: verifiers 0.4 rebuilt its API around harnesses and needs
openai < 3 (agentdojo's venv pins openai 3.57), mcp and prime-* packages. The classic
contract — `dataset` rows with `prompt` and `info`, `setup_state`, `env_response`,
`is_completed`, `rollout(client, model, …)`, `rubric.score_rollout` — is what this class
answers to; nothing here has been run under verifiers itself.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

from . import dataset as ds
from . import rubric
from .rollout import Episode, Gym, Rollout, RolloutError, chat_policy, openai_messages, openai_tools, reply_of


class Rubric:
    """The reward functions and their weights, as verifiers' Rubric holds them: the
    agent's reward (weight 1) and the attacker's (weight 0: reported, not summed into
    the agent's). An errored rollout has no reward (None) and its `error`."""

    def __init__(self):
        self.funcs = [self.agent, self.attacker]
        self.weights = [1.0, 0.0]

    @staticmethod
    def agent(state: dict, **_) -> float | None:
        return state["rollout"].rewards["agent"]

    @staticmethod
    def attacker(state: dict, **_) -> float | None:
        return state["rollout"].rewards["attacker"]

    def score_rollout(self, prompt=None, completion=None, answer=None, state=None, **kwargs) -> dict:
        result: Rollout = state["rollout"]
        scores = {f.__name__: f(state) for f in self.funcs}
        if result.error is not None:
            return {"reward": None, "error": result.error, **scores}
        total = sum(w * (scores[f.__name__] or 0.0) for f, w in zip(self.funcs, self.weights) if w)
        return {"reward": total, "error": None, **scores}


class PruefstandEnv:
    """A plan's cases as an environment (see the module's docstring). Build it with
    `load_environment`."""

    def __init__(self, dataset: ds.Dataset, out: Path, *, weights: rubric.Weights, kinds, retries: int,
                 defence: str | None, display_name: str, case_timeout_s: float | None):
        self.out = out
        self.cases = dataset.cases
        self.data = dataset
        self.weights = weights
        self.retries = retries
        self.manifest_path = ds.write(dataset, out, kinds=kinds, weights=weights.as_dict())
        self.gym = Gym(dataset, out, weights=weights, defence=defence, display_name=display_name,
                       case_timeout_s=case_timeout_s)
        self.rubric = Rubric()
        self._prompts: dict = {}
        self._lock = threading.Lock()

    # --- the dataset ---

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def prompt(self, case: dict) -> list[dict]:
        """What the policy is shown first: AgentDojo's system message and the user's
        task (an attacked case's injection arrives later, in a tool result)."""
        with self._lock:
            if case["id"] not in self._prompts:
                from agentdojo.agent_pipeline.agent_pipeline import load_system_message

                suite = self.gym.suites[case["suite"]]
                task = (suite.get_injection_task_by_id(case["injection_task"]) if case["kind"] == "injection_goal"
                        else suite.get_user_task_by_id(case["user_task"]))
                text = task.GOAL if case["kind"] == "injection_goal" else task.PROMPT
                self._prompts[case["id"]] = [{"role": "system", "content": load_system_message(None)},
                                             {"role": "user", "content": text}]
            return [dict(m) for m in self._prompts[case["id"]]]

    @property
    def dataset(self) -> list[dict]:
        """verifiers' rows: `prompt` (chat messages), `answer` (none: the rubric checks the
        environment), `task`, `info` (the case)."""
        return [{"prompt": self.prompt(c), "answer": "", "task": f"pruefstand/{self.data.plan}", "info": {"case": c}}
                for c in self.cases]

    def case(self, case_or_id) -> dict:
        if isinstance(case_or_id, dict):
            case_or_id = (case_or_id.get("case") or case_or_id)["id"]
        return self.data.case(case_or_id)

    # --- the plain rollout API (TRL's GRPO, any trainer) ---

    def rollout_case(self, case, policy, *, retries: int | None = None) -> Rollout:
        """One rollout of `case` (a case, its id, or a row's `info`) with `policy`
        (`EndpointPolicy`, `CallbackPolicy`, `chat_policy(fn)`): its conversation, record
        and rewards; an error is returned as such after the retries, with no reward."""
        policy.prepare(self.out)
        return self.gym.rollout(self.case(case), policy, retries=self.retries if retries is None else retries)

    def rollout_batch(self, cases, policy, *, jobs: int = 4, retries: int | None = None) -> list[Rollout]:
        policy.prepare(self.out)
        return self.gym.rollouts([self.case(c) for c in cases], policy, jobs=jobs,
                                 retries=self.retries if retries is None else retries)

    def episode(self, case) -> Episode:
        """A rollout whose turns the caller produces (`Episode.start`, `Episode.step`)."""
        return Episode(self.gym, self.case(case))

    @property
    def stats(self) -> dict:
        """Rollouts made, errors among them (no reward), retries, seconds spent."""
        return dict(self.gym.stats)

    # --- the verifiers-style multi-turn protocol ---

    def setup_state(self, state: dict, **_) -> dict:
        """Starts the case of `state["info"]` and waits for its first turn: the prompt
        (`state["prompt"]`, OpenAI messages) and the tools (`state["tools"]`)."""
        episode = self.episode(state["info"])
        query = episode.start()
        state["episode"] = episode
        state["done"] = query is None
        state["prompt"] = openai_messages(query) if query else []
        state["tools"] = openai_tools(query) if query else []
        state["seen"] = len(state["prompt"])
        if query is None:
            state["rollout"] = episode.result
        return state

    def env_response(self, messages: list[dict], state: dict, **_) -> tuple[list[dict], dict]:
        """The model's last message handed to the case; what the environment answered
        (tool results) back, or nothing when the case ended (then `state["rollout"]`)."""
        episode: Episode = state["episode"]
        if state["done"]:
            return [], state
        query = episode.step(reply_of(messages[-1]))
        if query is None:
            state["done"] = True
            state["rollout"] = episode.result
            return [], state
        new = openai_messages(query)
        answered = [m for m in new[state["seen"]:] if m["role"] != "assistant"]
        state["seen"] = len(new)
        state["tools"] = openai_tools(query)
        return answered, state

    def is_completed(self, messages: list[dict], state: dict, **_) -> bool:
        return bool(state.get("done"))

    def rollout(self, client, model: str, prompt=None, answer="", task=None, info=None, sampling_args=None, **_):
        """verifiers' rollout: the case of `info` with `client` (an OpenAI-compatible
        client: `client.chat.completions.create`) as the policy. Returns the conversation
        (OpenAI messages) and the state, whose `rollout` the rubric scores."""
        sampling = dict(sampling_args or {})

        def complete(messages, tools):
            response = client.chat.completions.create(model=model, messages=messages, tools=tools, **sampling)
            message = response.choices[0].message
            return message.model_dump() if hasattr(message, "model_dump") else dict(message)

        result = self.rollout_case(info, chat_policy(complete))
        return result.conversation, {"info": info, "rollout": result}


def load_environment(plan: str = "schnell", *, seed: int = 0, out=None, root=None, pruefstand=None,
                     kinds=ds.DEFAULT_KINDS, utility_weight: float = rubric.DEFAULT_WEIGHTS["utility"],
                     resisted_weight: float = rubric.DEFAULT_WEIGHTS["resisted"], filters: dict | None = None,
                     retries: int = 1, defence: str | None = None, display_name: str = "Local model",
                     case_timeout_s: float | None = None) -> PruefstandEnv:
    """The environment of `plan` (a name under the bench root's profiles/ or a plan file):

    - `seed`: the per-run wording of its families is drawn from it (as a run's seed does);
    - `out`: the environment's folder — `dataset.jsonl` and its manifest, `rollouts.jsonl`,
      one folder per rollout (default: a new temporary folder);
    - `root`, `pruefstand`: the bench root and the binary that resolve the plan
      (default: the binary's own search, `pruefstand` on PATH or $PRUEFSTAND_BIN);
    - `kinds`: `attacked` (default) and/or `clean`;
    - `utility_weight`, `resisted_weight`: the agent's reward (rubric.py; 0.5 and 0.5);
    - `filters`: narrows the plan as `pruefstand gym`'s flags do;
    - `retries`: tries again of a rollout that errored before it is returned as an error;
    - `defence`: one of AgentDojo's defences the gym composes (not `pi_detector`);
    - `display_name`: the model name AgentDojo's attacks address the model by.

    Families the plan holds out never enter the dataset (dataset.py)."""
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise RolloutError(f"retries {retries!r}: a whole number >= 0")
    weights = rubric.Weights(utility=utility_weight, resisted=resisted_weight)
    resolved = ds.resolve(plan, seed=seed, root=root, pruefstand=pruefstand, filters=filters)
    data = ds.build(resolved, kinds=kinds)
    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="pruefstand-env-"))
    if (out / "rollouts").exists() or (out / "rollouts.jsonl").exists():
        raise RolloutError(f"{out} holds an environment's rollouts already: give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    return PruefstandEnv(data, out.resolve(), weights=weights, kinds=tuple(kinds), retries=retries, defence=defence,
                         display_name=display_name, case_timeout_s=case_timeout_s)
