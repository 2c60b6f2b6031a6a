"""deployctl: deploy SGLang as a systemd service and prove each change worked."""

__version__ = "0.1.0"
