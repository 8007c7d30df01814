#!/bin/bash
# Runs a command inside a build container with the host's pip settings:
# scripts/build-vllm-cpu-image mounts its build folder at /build, holding
#   env        `export` lines: the host's package index, proxy and timeout settings
#              (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, http(s)_proxy, …) and PIP_CERT etc.
#              pointing at /build/ca-certificates.crt, the host's CA bundle (TLS may be
#              re-signed on the host's network)
#   pip/*.conf the host's pip configuration files, in the order pip reads them
# The configuration files are merged (later ones win, as in pip) into /build/pip.conf.
# Nothing of this ends up in the image: /build is a mount.
set -euo pipefail
if [[ -r /build/env ]]; then
    # shellcheck disable=SC1091
    . /build/env
fi
shopt -s nullglob
confs=(/build/pip/*.conf)
if (( ${#confs[@]} )); then
    python3 - "${confs[@]}" <<'PY'
import configparser, sys
merged = configparser.RawConfigParser()
merged.read(sys.argv[1:])
with open("/build/pip.conf", "w") as out:
    merged.write(out)
PY
    export PIP_CONFIG_FILE=/build/pip.conf
fi
exec "$@"
