"""Checks of an inventory's text values (pydantic AfterValidators): each returns the value or raises
ValueError with what the value must be."""

from __future__ import annotations

import re

from agent.protocol.common import HTTP_URL, UNIT_NAME, find_control

GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def no_control(value: str) -> str:
    if find_control(value):
        raise ValueError("must not contain control characters (newline, tab, escape...)")
    return value


def not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or blank")
    return value


def unit_name(value: str) -> str:
    if not UNIT_NAME.fullmatch(value) or ".." in value:
        raise ValueError("must be a plain unit file name ending in .service (no '/' or '..')")
    return value


def absolute(value: str) -> str:
    if not value.startswith("/") or "/../" in value + "/":
        raise ValueError("must be an absolute path without '..'")
    return value


def http_url(value: str) -> str:
    if not HTTP_URL.fullmatch(value):
        raise ValueError("must be an http:// or https:// URL: host, optional port and path")
    return value


def group_name(value: str) -> str:
    # Ansible host patterns treat ':', ',', '&', '!', '[' and '*' as operators; "all" and "ungrouped"
    # are its own groups.
    if not GROUP_NAME.fullmatch(value) or value in ("all", "ungrouped"):
        raise ValueError(
            f"group {value!r} must start with a letter or '_' and hold only letters, digits, '_' and '-' "
            "(not 'all' or 'ungrouped')"
        )
    return value


def distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("names a group twice")
    return values
