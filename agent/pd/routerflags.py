"""The router's flags checked by sglang-router's own parser (`sglang_router.launch_router.parse_router_args`)
where the release the file names is installed here, else against the table of its options below: a flag
it does not take stops the router's start (argparse exits 2: "unrecognized arguments").
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence

from agent.inventory import HostConfig
from agent.pd.router import router_flags, router_words
from agent.pd.units import pd_units, spec
from agent.sglang.flags import flag_words

# sglang-router 0.3.2's options (RouterArgs.add_cli_args, use_router_prefix=False), without the "--"
_TEXT_0_3_2 = """
    api-key assignment-mode backend balance-abs-threshold balance-rel-threshold
    bucket-adjust-interval-secs ca-cert-paths cache-threshold cb-failure-threshold
    cb-success-threshold cb-timeout-duration-secs cb-window-duration-secs chat-template
    client-cert-path client-key-path control-plane-api-keys control-plane-audit-enabled
    cors-allowed-origins decode decode-policy decode-selector disable-circuit-breaker
    disable-health-check disable-retries dp-aware enable-igw enable-trace eviction-interval-secs
    health-check-endpoint health-check-interval-secs health-check-timeout-secs
    health-failure-threshold health-success-threshold history-backend host jwt-audience jwt-issuer
    jwt-jwks-uri jwt-role-mapping log-dir log-level max-concurrent-requests max-idle-secs
    max-payload-size max-tree-size mcp-config-path mini-lb model-path oracle-connect-descriptor
    oracle-password oracle-pool-max oracle-pool-min oracle-pool-timeout-secs oracle-tns-alias
    oracle-username oracle-wallet-path otlp-traces-endpoint pd-disaggregation policy port
    postgres-db-url postgres-pool-max prefill prefill-policy prefill-selector
    prometheus-duration-buckets prometheus-host prometheus-port queue-size queue-timeout-secs
    rate-limit-tokens-per-second reasoning-parser redis-pool-max redis-retention-days redis-url
    request-id-headers request-timeout-secs retry-backoff-multiplier retry-initial-backoff-ms
    retry-jitter-factor retry-max-backoff-ms retry-max-retries selector service-discovery
    service-discovery-namespace service-discovery-port shutdown-grace-period-secs tls-cert-path
    tls-key-path tokenizer-cache-enable-l0 tokenizer-cache-enable-l1 tokenizer-cache-l0-max-entries
    tokenizer-cache-l1-max-memory tokenizer-path tool-call-parser worker-startup-check-interval
    worker-startup-timeout-secs worker-urls
"""
OPTIONS_0_3_2 = frozenset(_TEXT_0_3_2.split())
TABLES = {"0.3.2": OPTIONS_0_3_2}
Parser = Callable[[Sequence[str]], object]


def installed_parser(version: str) -> Parser | None:
    """sglang-router's own parser, where the release `version` is installed here; None otherwise."""
    try:
        from importlib.metadata import version as installed

        if installed("sglang-router") != version:
            return None
        from sglang_router.launch_router import parse_router_args  # type: ignore[import-untyped]
    except Exception:  # not installed, or a broken install: the table stands in
        return None
    return parse_router_args  # type: ignore[no-any-return]


def _parsed(parse: Parser, words: Sequence[str]) -> str | None:
    """The parser's complaint (its last line), or None."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parse(list(words))
    except SystemExit:
        last = said.getvalue().strip().splitlines()
        return last[-1].split("error: ", 1)[-1] if last else "refused"
    except Exception as exc:  # its own validation (RouterArgs) raising
        return str(exc) or type(exc).__name__
    return None


def router_flag_problems(host: HostConfig) -> list[str]:
    """[pd.router] flags the router release the file names would refuse, each in one line."""
    router = spec(host).router
    words = [w for name, value in router_flags(host).items() for w in flag_words(name, value)]
    parse = installed_parser(router.version)
    if parse is not None:
        said = _parsed(parse, [*router_words(host, pd_units(host)), *words])
        return (
            []
            if said is None
            else [f"router: sglang-router {router.version} refuses it: {said}: fix [pd.router] flags"]
        )
    table = TABLES.get(router.version)
    unknown = [name for name in router.flags if table is not None and name not in table]
    return [
        f"router: --{name} is not a flag of sglang-router {router.version}: fix [pd.router] flags "
        "(its flags: python -m sglang_router.launch_router --help)"
        for name in unknown
    ]
