"""The simulated weight cache: what SGLang 0.5.23's daemon and its client do, in files instead of CUDA IPC.

From the wheel: srt/weight_cache/protocol.py (CacheConfig: the fingerprint; IPC_QUANT_ALLOWLIST; the
{device_uuid} socket/ready templates of srt/environ.py, default under /tmp), daemon.py (one daemon per GPU,
a .ready file holding its PID once the weights are loaded), ipc_loader.py (a client maps the weights; any
fingerprint mismatch falls back to loading from disk), arg_groups/model_path_hook.py (no speculative
decoding with the weight cache). The sim's "socket" is a JSON file holding the daemon's fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

SOCKET_TEMPLATE = ("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", "/tmp/sglang_weight_cache_{device_uuid}.sock")
READY_TEMPLATE = ("SGLANG_WEIGHT_CACHE_READY_TEMPLATE", "/tmp/sglang_weight_cache_{device_uuid}.ready")
ALLOWLIST = ("", "fp8")  # protocol.py IPC_QUANT_ALLOWLIST (fp8: block-wise only; the sim takes it as such)
SPECULATIVE_REFUSAL = (
    "ValueError: --weight-cache-mode is not supported together with speculative decoding "
    "(--speculative-algorithm): the weight cache daemon does not export the draft model's weights. "
    "Disable one of them (--weight-cache-mode off) for this configuration."
)


def device_uuid(gpu: int) -> str:
    return f"GPU-5151-{gpu:04d}"


def path(template: tuple[str, str], gpu: int, env: dict[str, str]) -> Path:
    text = env.get(template[0]) or template[1]
    if "{device_uuid}" not in text:
        raise SystemExit(f"ValueError: {template[0]}={text!r} must contain '{{device_uuid}}'")
    return Path(text.format(device_uuid=device_uuid(gpu)))


def fingerprint(args: argparse.Namespace) -> dict[str, object]:
    """CacheConfig's fields the sim can tell apart (torch_version: the sim's own)."""
    return {
        "model_path": args.model_path,
        "tp_size": args.tp_size,
        "dp_size": getattr(args, "dp_size", 1),
        "quant_method": getattr(args, "quantization", None) or "",
        "dtype": getattr(args, "dtype", None) or "auto",
        "torch_version": "sim",
    }


def quant_refusal(quant: str) -> str | None:
    if quant in ALLOWLIST:
        return None
    return (
        f"UnsupportedQuantForIPCError: [weight_cache:daemon] quantization method {quant!r} is not verified "
        "for CUDA IPC zero-copy weight sharing. Verified methods: '' (unquantized), 'fp8'."
    )


def publish(args: argparse.Namespace, gpus: int, env: dict[str, str]) -> list[Path]:
    """The daemon's files once its weights are resident: the fingerprint, then the ready file."""
    written = []
    for gpu in range(gpus):
        sock, ready = path(SOCKET_TEMPLATE, gpu, env), path(READY_TEMPLATE, gpu, env)
        sock.parent.mkdir(parents=True, exist_ok=True)
        sock.write_text(json.dumps(fingerprint(args)))
        ready.write_text(str(os.getpid()))
        written += [sock, ready]
    return written


def lookup(args: argparse.Namespace, env: dict[str, str]) -> str:
    """What a client finds for GPU 0: "hit", "mismatch", or "absent" (no live daemon ready)."""
    ready = path(READY_TEMPLATE, 0, env)
    try:
        os.kill(int(ready.read_text().strip()), 0)
        held = json.loads(path(SOCKET_TEMPLATE, 0, env).read_text())
    except (OSError, ValueError):
        return "absent"
    return "hit" if held == fingerprint(args) else "mismatch"
