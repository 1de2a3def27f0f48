"""Optional bearer-token auth for the gateway: one token, or one per client.

The tokens come from an environment variable (one) or a file (one a line;
blank lines and `#` comments skipped), never from the command line (where
`ps` would show them), and each is compared in constant time. A request's
client is the token it carries, named by its line ("token 2"), never by the
token itself: what the rate limit counts by and what the logs may say.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from ...configs import ConfigError, GatewaySettings


class BearerAuth:
    def __init__(self, tokens: str | list[str] | None) -> None:
        given = [tokens] if isinstance(tokens, str) else tokens or []
        self._tokens = [token.encode() for token in given if token]

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> BearerAuth:
        """The file wins over the variable; neither set means auth is off."""
        if settings.token_file:
            try:
                lines = Path(settings.token_file).read_text().splitlines()
            except OSError as exc:
                raise ConfigError(f"gateway token file {settings.token_file!r}: {exc}") from None
            tokens = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
            if not tokens:
                raise ConfigError(f"gateway token file {settings.token_file!r} is empty")
            return cls(tokens)
        return cls(os.environ.get(settings.token_env) or None)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def client(self, authorization: str | None) -> str | None:
        """Whose request this is: "token N" for the N-th token, "" with auth off, None for no valid token."""
        if not self._tokens:
            return ""
        # RFC 9110 (11.1, 11.4): the scheme is case-insensitive, then one or more spaces (not tabs) before
        # the token; the parser has already trimmed the value's ends.
        scheme, _, given = (authorization or "").partition(" ")
        try:
            # aiohttp keeps undecodable header bytes as lone surrogates, which have no UTF-8 form.
            sent = given.lstrip(" ").encode()
        except UnicodeEncodeError:
            return None
        found = None
        for number, token in enumerate(self._tokens, 1):  # every one compared: the time tells not which matched
            if hmac.compare_digest(sent, token) and found is None:
                found = number
        return f"token {found}" if found is not None and scheme.lower() == "bearer" else None

    def allows(self, authorization: str | None) -> bool:
        return self.client(authorization) is not None
