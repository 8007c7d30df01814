"""pruefstand's environment for trainers: a plan's cases as rollouts through the gym,
with rewards for the agent and the attacker (docs/training.md, "An environment a trainer
steps").

    import sys; sys.path.insert(0, "<the gym's scripts folder>")   # `pruefstand setup` prints it
    from pruefstand_env import load_environment, EndpointPolicy
    env = load_environment("schnell", seed=7, out="envs/night-1")
    policy = EndpointPolicy("http://127.0.0.1:8000/v1", "my-lora")
    result = env.rollout_case(env.cases[0], policy)      # result.rewards["agent"], result.conversation

Run with the bench's managed venv (agentdojo 0.1.35). Modules: `dataset` (the plan's
cases from `pruefstand gym --dataset`, held-out families left out, the manifest),
`rollout` (the gym's case runner in this process; policies; episodes), `rubric` (the
rewards), `environment` (`load_environment` and the verifiers-style class), `players`
(the attacker as a policy: its templates per rollout, its reward back; the rounds).
"""

import os as _os
import sys as _sys

# The gym's packages (pruefstand_gym, custom_suites) lie beside this one.
_HERE = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _HERE not in _sys.path:
    _sys.path.insert(0, _HERE)

from .dataset import Dataset, DatasetError  # noqa: E402
from .environment import PruefstandEnv, Rubric, load_environment  # noqa: E402
from .players import Pair, SimulatedAttacker, agent_round, alternate, attacker_round, pairs_of  # noqa: E402
from .rollout import (  # noqa: E402
    CallbackPolicy,
    EndpointPolicy,
    Episode,
    Rollout,
    RolloutError,
    chat_policy,
    steered_jobs,
)
from .rubric import Weights  # noqa: E402

__all__ = [
    "CallbackPolicy",
    "Dataset",
    "DatasetError",
    "EndpointPolicy",
    "Episode",
    "Pair",
    "PruefstandEnv",
    "Rollout",
    "RolloutError",
    "Rubric",
    "SimulatedAttacker",
    "Weights",
    "agent_round",
    "alternate",
    "attacker_round",
    "chat_policy",
    "load_environment",
    "pairs_of",
    "steered_jobs",
]
