"""Prefill-decode disaggregation: the roles' units, their plans, the refusals and the router's unit (pure)."""
