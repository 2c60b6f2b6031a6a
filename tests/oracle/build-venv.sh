#!/bin/sh
# Build the oracle venv once per machine: SGLang 0.5.23's wheel from PyPI with --no-deps, CPU torch, and the
# light packages in requirements.txt. Idempotent: a venv whose stamp matches the requirements is kept.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${DEPLOYCTL_ORACLE_VENV:-$HOME/.cache/deployctl/oracle-sglang-0.5.23}
stamp="$venv/.oracle-stamp"
want=$(cat "$here/requirements.txt" "$here/build-venv.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
py=$(command -v python3.11 || command -v python3)
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 11), "the oracle needs CPython 3.11 (cp311 wheels)"'
echo "building the SGLang 0.5.23 oracle venv in $venv (once; about 1.4 GB)"
tmp="$venv.build-$$"
rm -rf "$tmp" && mkdir -p "$(dirname "$venv")"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp"
pip="$tmp/bin/python -m pip --disable-pip-version-check -q"
# torch first and pinned for every later step, so nothing pulls a CUDA build in its place
$pip install --only-binary=:all: 'torch==2.13.0'
grep -E '^torch==' "$here/requirements.txt" > "$tmp/pin.txt"
$pip download --no-deps --only-binary=:all: -d "$tmp/dl" 'sglang==0.5.23'
$pip install --no-warn-conflicts --no-deps "$tmp"/dl/sglang-0.5.23-*.whl
$pip install --no-warn-conflicts -c "$tmp/pin.txt" -r "$here/requirements.txt"
$pip install --no-warn-conflicts --no-deps 'compressed-tensors==0.18.0'  # its own pins would replace torch
"$tmp/bin/python" -c 'import torch; assert not torch.version.cuda, torch.__version__'
rm -rf "$tmp/dl" "$tmp/pin.txt"
rm -rf "$venv" && mv "$tmp" "$venv"
trap - EXIT
echo "$want" > "$stamp"
du -sh "$venv"
