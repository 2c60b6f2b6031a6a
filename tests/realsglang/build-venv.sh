#!/bin/sh
# Build the real-SGLang venv once per machine: the PyPI release of SGLang 0.5.23 on CPU torch, run by the
# tests' nspawn host too. Made by Debian's /usr/bin/python3.11, which the host's rootfs has at the same path,
# so the venv runs there when bind-mounted read-only at this same path. Idempotent: a stamp holds the hash
# of this recipe.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${DEPLOYCTL_REAL_SGLANG_VENV:-$HOME/.cache/deployctl/real-sglang-0.5.23}
stamp="$venv/.real-stamp"
want=$(cat "$here/requirements.txt" "$here/build-venv.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
py=/usr/bin/python3.11
[ -x "$py" ] || { echo "real-sglang: needs Debian's $py (apt-get install python3.11-venv)" >&2; exit 1; }
echo "building the real SGLang 0.5.23 venv in $venv (once; about 1.5 GB)"
started=$(date +%s)
tmp="$venv.build-$$"
rm -rf "$tmp" && mkdir -p "$(dirname "$venv")"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp"
pip="$tmp/bin/python -m pip --disable-pip-version-check -q"
# torch first (a local CPU wheel here) and pinned for every later step, so nothing pulls a CUDA build
$pip install --only-binary=:all: 'torch==2.13.0'
echo 'torch==2.13.0' > "$tmp/pin.txt"
# their metadata pins torch 2.14.1, CUDA kernel packages and triton: install them alone
$pip install --no-warn-conflicts --no-deps 'sglang==0.5.23' 'xgrammar==0.2.7' 'compressed-tensors==0.18.0'
$pip install --no-warn-conflicts -c "$tmp/pin.txt" -r "$here/requirements.txt"
rm -f "$tmp/pin.txt"
# The CPU-only promise, checked: no CUDA torch, no NVIDIA wheel, no triton.
"$tmp/bin/python" - <<'PY'
import importlib.metadata as md
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
names = sorted({d.metadata["Name"].lower() for d in md.distributions()})
bad = [n for n in names if n.startswith("nvidia-") or n in ("triton", "pytorch-triton")]
assert not bad, f"GPU packages installed: {bad}"
print(f"real-sglang: {len(names)} packages, torch {torch.__version__}, no CUDA, no nvidia-*, no triton")
PY
find "$tmp" -name '__pycache__' -prune -o -name '*.pyc' -print >/dev/null  # (bytecode kept: faster starts)
# The venv's scripts name the folder they were built in; move them to the final path.
grep -rlF "$tmp" "$tmp/bin" 2>/dev/null | while read -r f; do sed -i "s|$tmp|$venv|g" "$f"; done
sed -i "s|$tmp|$venv|g" "$tmp/pyvenv.cfg"
rm -rf "$venv" && mv "$tmp" "$venv"
trap - EXIT
echo "$want" > "$stamp"
echo "real-sglang: built in $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)"
