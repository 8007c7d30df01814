"""The running server's word on each row: vLLM's `/tokenize` given the same messages and
tools must give the same token ids as the trainer's own rendering (rows.py), for every
prompt the row holds and for each prompt+completion rendered whole.

The request carries no chat template: the server applies the one it serves (its
`--chat-template`, else the model folder's) — which is the thing checked. Tool calls'
`arguments` go as JSON strings, as the OpenAI format has them and vLLM's request
schema requires; vLLM parses them back into objects before the template sees them,
as the export holds them.

Not here: rendering (rows.py). An API key, when the server wants one for /tokenize,
comes from the environment variable PRUEFSTAND_TOKENIZE_KEY (never from the request
file).
"""

import copy
import json
import os
import urllib.error
import urllib.request

from .request import Refused
from .rows import first_difference, token_text


def for_server(messages):
    """MESSAGES as an OpenAI chat request carries them: call arguments as JSON text."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            args = call["function"].get("arguments")
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args, ensure_ascii=False)
    return out


class Tokenize:
    def __init__(self, url, model, timeout=120):
        self.url = url
        self.model = model
        self.timeout = timeout
        self.calls = 0

    def ids(self, messages, tools, generation_prompt):
        body = {
            "model": self.model,
            "messages": for_server(messages),
            "tools": tools,
            "add_generation_prompt": generation_prompt,
            "continue_final_message": False,
            "add_special_tokens": False,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get("PRUEFSTAND_TOKENIZE_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        self.calls += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace")
            return None, f"the server's /tokenize answered {e.code}: {detail}"
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"cannot reach the server's /tokenize at {self.url}: {e}") from None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise RuntimeError(f"the server's /tokenize at {self.url} gave no token list: {str(answer)[:300]}")
        return tokens, None

    def check(self, tokenizer, row, checks):
        """Refuses ROW at the first of CHECKS where the server's ids differ from ours."""
        for what, messages, generation_prompt, ours in checks:
            theirs, error = self.ids(messages, row.tools, generation_prompt)
            if error is not None:
                row.refuse(f"the server would not apply its template to {what}: {error}")
            at = first_difference(ours, theirs)
            if at is None:
                continue
            mine = f"{ours[at]} ({token_text(tokenizer, ours[at])})" if at < len(ours) else f"nothing (ours ends at {len(ours)} tokens)"
            server = (
                f"{theirs[at]} ({token_text(tokenizer, theirs[at])})" if at < len(theirs) else f"nothing (the server's ends at {len(theirs)} tokens)"
            )
            raise Refused(f"row {row.where}: token {at} differs: ours {mine} vs server's {server} (in {what})")
