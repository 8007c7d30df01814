"""pruefstand's trainer: a PEFT LoRA trained with TRL (DPO or SFT) on the rows of
`pruefstand export` files, inside the model's own Docker image.

    PYTHONHASHSEED=0 python -m pruefstand_train /work/request.json

The request (written by `pruefstand train`) names the base model, the served chat
template, the export files, the running server's `/tokenize`, where the adapter and the
checkpoints go, and the hyperparameters; stdout carries one JSON event a line. Every
row is rendered with the template the server applies and checked against the server
token for token before the first step (`rows.py`, `server.py`); training checkpoints
every step and resumes from the last one (`train.py`). docs/training.md describes the
request, the events and the refusals.

Not here: which exports may be trained on (the held-out guard), the training manifest,
the queue, the new version's spec — the Rust side does those.
"""
