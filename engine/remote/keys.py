"""API keys for remote servers: from an environment variable or the OS keyring, never from a file.

The keyring entry is stored under the service `specula` with the server's base URL as the user name.
On a machine without a keyring service (a bare Linux session), storing fails with a message that says
to use an environment variable instead.
"""

from __future__ import annotations

import os
import re

from .http import RemoteError, normalize_url

SERVICE = "specula"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_name(name: str) -> str:
    name = (name or "").strip()
    if name and not _ENV_NAME.match(name):
        raise RemoteError(f"'{name}' is not an environment variable name (letters, digits and _ only)")
    return name


def resolve_api_key(server_url: str, env_var: str = "", use_keyring: bool = True, given: str = "") -> str | None:
    """The key for this server: `given` (a caller's own key), else the named environment variable (which must
    then be set), else the keyring's entry for the server, else None (no key: a local server usually needs
    none)."""
    if given.strip():
        return given.strip()
    env_var = check_env_name(env_var)
    if env_var:
        value = os.environ.get(env_var, "").strip()
        if not value:
            raise RemoteError(f"the API key variable {env_var} is not set in the environment")
        return value
    if use_keyring:
        return keyring_get(server_url)
    return None


def _keyring():
    try:
        import keyring
        from keyring.backends.fail import Keyring as NoKeyring
    except ImportError:
        return None
    backend = keyring.get_keyring()
    return None if isinstance(backend, NoKeyring) else keyring


def keyring_available() -> bool:
    return _keyring() is not None


def keyring_get(server_url: str) -> str | None:
    ring = _keyring()
    if ring is None:
        return None
    try:
        return ring.get_password(SERVICE, normalize_url(server_url)) or None
    except Exception:  # keyring backends raise their own error types (locked, denied, dbus gone)
        return None


def keyring_set(server_url: str, key: str | None) -> None:
    """Store (or with an empty key, delete) the server's key in the OS keyring."""
    ring = _keyring()
    if ring is None:
        raise RemoteError("no OS keyring is available here: put the key in an environment variable and name "
                          "that variable instead")
    url = normalize_url(server_url)
    try:
        if key:
            ring.set_password(SERVICE, url, key)
        elif ring.get_password(SERVICE, url) is not None:
            ring.delete_password(SERVICE, url)
    except Exception as exc:  # keyring backends raise their own error types
        raise RemoteError(f"the OS keyring refused the key: {exc}") from None
