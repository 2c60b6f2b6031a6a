"""The simulated Mooncake engine: what SGLang imports for the mooncake backend (`from mooncake.engine import
TransferEngine`), so a [pd] apply's import of it on the simulated host passes. It transfers nothing."""


class TransferEngine:
    """A stand-in: the simulated roles move no KV."""
