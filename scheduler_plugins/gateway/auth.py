"""Optional bearer-token auth for the gateway.

The token comes from an environment variable or a file, never from the
command line (where `ps` would show it), and is compared in constant time.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from shoal.configs import ConfigError, GatewaySettings


class BearerAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> BearerAuth:
        """The file wins over the variable; neither set means auth is off."""
        if settings.token_file:
            try:
                token = Path(settings.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"gateway token file {settings.token_file!r}: {exc}") from None
            if not token:
                raise ConfigError(f"gateway token file {settings.token_file!r} is empty")
            return cls(token)
        return cls(os.environ.get(settings.token_env) or None)

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def allows(self, authorization: str | None) -> bool:
        if self._token is None:
            return True
        # RFC 9110 (11.1, 11.4): the scheme is case-insensitive, then one or more spaces (not tabs) before
        # the token; the parser has already trimmed the value's ends.
        scheme, _, given = (authorization or "").partition(" ")
        try:
            # aiohttp keeps undecodable header bytes as lone surrogates, which have no UTF-8 form.
            sent = given.lstrip(" ").encode()
        except UnicodeEncodeError:
            return False
        return scheme.lower() == "bearer" and hmac.compare_digest(sent, self._token)
