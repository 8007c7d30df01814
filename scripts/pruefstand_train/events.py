"""The trainer's events: one JSON object a line on the process's real stdout, and
nothing else there.

TRL, transformers and the libraries under them print to stdout (the Trainer's log
lines, warnings); the consumer reads stdout as a protocol. So at start the real stdout
is kept aside and file descriptor 1 pointed at stderr: everything else anyone prints,
Python or C, lands on stderr.
"""

import json
import os
import sys

_out = None


def take_stdout():
    """Keeps the real stdout for events and sends everything else to stderr."""
    global _out
    if _out is not None:
        return
    sys.stdout.flush()
    _out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)


def emit(event, **fields):
    """Writes {"event": EVENT, **fields} as one line and flushes it."""
    if _out is None:
        take_stdout()
    _out.write(json.dumps({"event": event, **fields}, ensure_ascii=False, allow_nan=False) + "\n")
    _out.flush()
