"""`python -m pruefstand_train [--check-only] REQUEST.json`: read the request, render and
check every row, train, write the adapter (`--check-only`: stop after the check, whose
`checked` event is then the last). Exit 0 done, 2 refused (the reason in a `refused`
event), 1 anything else (the traceback on stderr).

Not here: the work itself (request.py, rows.py, server.py, train.py).
"""

import os
import sys
import time
import traceback

from . import events
from .request import Refused


def say(message):
    print(f"pruefstand_train: {message}", file=sys.stderr, flush=True)


def main(argv):
    events.take_stdout()
    check_only = argv[:1] == ["--check-only"]
    argv = argv[1:] if check_only else argv
    if len(argv) != 1:
        say("usage: python -m pruefstand_train [--check-only] REQUEST.json")
        return 2
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Only adapter_config.json's target_modules order hangs on it, and that is
        # sorted; said because the contract expects it.
        say("PYTHONHASHSEED is not 0")
    try:
        from . import request as request_mod
        from . import rows as rows_mod

        request = request_mod.load(argv[0])
        if request.kind == "grpo":
            if check_only:
                raise Refused("--check-only: an online training has no rows to check")
            from . import grpo

            grpo.run(request, say)
            return 0
        rows = rows_mod.read(request.rows, request.kind)
        if not rows:
            raise Refused(f"no rows: the export files ({', '.join(request.rows)}) hold none")
        tokenizer, template = rows_mod.load_tokenizer(request.base_model, request.chat_template)
        renderer = rows_mod.Renderer(tokenizer, template)
        tokenize = None
        if request.tokenize_url is not None:
            from .server import Tokenize

            tokenize = Tokenize(request.tokenize_url, request.served_model)
        t0 = time.monotonic()
        tokens = 0
        for row in rows:
            checks = renderer.tokenise(row)
            if tokenize is not None:
                tokenize.check(tokenizer, row, checks)
            tokens += sum(len(v) for k, v in row.ids.items() if k.endswith("_ids"))
        say(
            f"{len(rows)} rows, {tokens} tokens rendered"
            + (f", {tokenize.calls} /tokenize answers matched" if tokenize else ", not checked against a server")
            + f" in {time.monotonic() - t0:.1f} s"
        )
        events.emit("checked", rows=len(rows), tokens=tokens, server=tokenize is not None)
        if check_only:
            return 0
        from . import train

        train.run(request, rows, tokenizer, template, say)
        return 0
    except Refused as e:
        events.emit("refused", reason=str(e))
        say(f"refused: {e}")
        return 2
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
