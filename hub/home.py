"""Where the hub keeps things, and its settings.

``HUB_HOME`` holds installed modules (``modules/<name>/<version>/``), downloaded archives
(``cache/``) and work in progress (``tmp/``). It is, in order: the ``HUB_HOME`` environment
variable, the ``home`` setting (``paddlejax hub config home PATH``), or ``hub/`` under the
user's cache directory. Settings live in a small JSON file under the user's config directory
(``PADDLEJAX_HUB_CONFIG`` names another): ``home`` and ``registries`` (URLs or paths of
registries that ``install NAME`` searches, in order).

>>> import os, tempfile
>>> os.environ["PADDLEJAX_HUB_CONFIG"] = os.path.join(tempfile.mkdtemp(), "hub.json")
>>> set_setting("registries", ["https://example.org/hub"])
>>> settings()["registries"]
['https://example.org/hub']
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from paddlejax.files import FileReadError, read_regular, write_together
from paddlejax.hub.errors import HubError

SETTINGS = {"home": str, "registries": list}


def config_path() -> Path:
    """The settings file: ``$PADDLEJAX_HUB_CONFIG``, else ``hub.json`` in the user's config directory."""
    if os.environ.get("PADDLEJAX_HUB_CONFIG"):
        return Path(os.environ["PADDLEJAX_HUB_CONFIG"])
    import platformdirs

    return Path(platformdirs.user_config_dir("paddlejax")) / "hub.json"


def settings() -> dict:
    """The saved settings (``{}`` when none are saved); a clear error for a damaged file."""
    path = config_path()
    if not path.exists():
        return {}
    try:
        doc = json.loads(read_regular(path, 1 << 20))
    except (FileReadError, ValueError) as e:
        raise HubError(f"hub settings {path}: unreadable ({e}); fix or delete the file") from None
    if not isinstance(doc, dict):
        raise HubError(f"hub settings {path}: not a JSON object; fix or delete the file")
    return {k: v for k, v in doc.items() if k in SETTINGS and isinstance(v, SETTINGS[k])}


def set_setting(key: str, value) -> None:
    """Save one setting (``None`` removes it); errors name the keys there are."""
    if key not in SETTINGS:
        raise HubError(f"unknown hub setting {key!r}; the settings are {', '.join(SETTINGS)}")
    if value is not None and not isinstance(value, SETTINGS[key]):
        raise HubError(f"hub setting {key!r} takes a {SETTINGS[key].__name__}, got {type(value).__name__}")
    current = settings()
    if value is None:
        current.pop(key, None)
    else:
        current[key] = value
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_together({path: (json.dumps(current, indent=2) + "\n").encode()})


def hub_home() -> Path:
    """The hub's directory (created if missing)."""
    home = os.environ.get("HUB_HOME") or settings().get("home")
    if not home:
        import platformdirs

        home = Path(platformdirs.user_cache_dir("paddlejax")) / "hub"
    home = Path(home).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def registries() -> list[str]:
    """The registries ``install NAME`` searches, in order: ``$PADDLEJAX_HUB_REGISTRY`` (one, or
    several separated by spaces) first, then the ``registries`` setting."""
    env = os.environ.get("PADDLEJAX_HUB_REGISTRY", "").split()
    return env + [r for r in settings().get("registries", []) if isinstance(r, str) and r not in env]
