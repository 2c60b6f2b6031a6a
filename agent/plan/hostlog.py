"""A start's HiCache host pool as its log says it (agent/sglang/logs: the `Allocating kv hierarchical KV host
pool` line and the auto-size line): what that start pinned, the plan's evidence for its host pool as the
device pool's logged line is for the device pool."""

from __future__ import annotations

from dataclasses import dataclass

from agent.plan.hostpool import HostPool


@dataclass(frozen=True)
class LoggedPool:
    """What a start's log says its host pool was: the `Allocating kv hierarchical KV host pool: N tokens,
    X GB host memory.` line (what that start pinned, per rank) and its auto-size line's ratios, if any."""

    tokens: int
    gb: float
    requested_ratio: float | None = None
    auto_ratio: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {"tokens": self.tokens, "gb": self.gb, "requested_ratio": self.requested_ratio,
                "auto_ratio": self.auto_ratio}  # fmt: skip

    def line(self, pool: HostPool, bytes_per_token: int) -> str:
        """The logged pool against the plan's: the same, or how it differs."""
        auto = (
            f", auto-sized ratio {self.requested_ratio:g} -> {self.auto_ratio:g}"
            if self.auto_ratio is not None and self.requested_ratio is not None
            else ""
        )
        head = (
            f"host pool: the logged start pinned {self.tokens:,} host-pool tokens ({self.gb:.2f} GB) per "
            f"rank{auto}"
        )
        if self.tokens == pool.tokens:
            return f"{head}: the same as this plan's"
        logged_cell = self.gb * 1e9 / self.tokens
        cell = (
            f"; its {logged_cell:,.0f} bytes per token against the plan's {bytes_per_token:,}: "
            "not the layout planned"
            if abs(logged_cell - bytes_per_token) > max(0.01 * bytes_per_token, 0.005e9 / self.tokens)
            else ""
        )
        return (
            f"{head}; this plan's {pool.tokens:,}: the flags, the device pool or the host's free memory "
            f"differ from that start's{cell}"
        )
