"""The ``web_config`` file, in Prometheus exporter-toolkit's format: TLS and basic auth.

Errors read ``FILE: key.path: reason`` (``FILE: line L, column C: reason`` for the YAML
itself).  As in exporter-toolkit (web/tls_config.go, ``SetDirectory``), relative
``cert_file``, ``key_file`` and ``client_ca_file`` are taken from the web config's directory.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import ssl
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Literal

from tpuwatch import yamlfile
from tpuwatch.schema import ConfigError, FilePath, build, join_key

_BCRYPT_RE = re.compile(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$")
_VERIFIED_CACHE_SIZE = 64
# Checked against when the user is unknown, so that timing does not tell which users exist.
_DUMMY_HASH = b"$2b$10$5TUUpN/ivwkbmNAoUJ.r0ezgUmnmktXsTiSH4ZoTlD0fTdLUj2d1m"

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True)
class TlsServerConfig:
    """exporter-toolkit's tls_server_config (the subset Python's ssl module can honour)."""

    cert_file: Annotated[str, FilePath(absolute=False)]
    key_file: Annotated[str, FilePath(absolute=False)]
    client_auth_type: Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = (
        "NoClientCert"
    )
    client_ca_file: Annotated[str, FilePath(absolute=False)] | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"

    def validate(self, path: str) -> None:
        if self.client_auth_type != "NoClientCert" and not self.client_ca_file:
            raise ConfigError(f"{path}.client_ca_file", f"required with client_auth_type {self.client_auth_type}")


@dataclass(frozen=True)
class WebConfigFile:
    """The top level of a web config file."""

    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = field(default_factory=dict)

    def validate(self, path: str) -> None:
        for user, hashed in self.basic_auth_users.items():
            if not _BCRYPT_RE.match(hashed):
                raise ConfigError(join_key(join_key(path, "basic_auth_users"), user),
                                  "expected a bcrypt hash ($2y$10$...)")


class WebConfig:
    """A loaded web config: an SSL context (or None) and a basic-auth checker."""

    def __init__(self, spec: WebConfigFile, ssl_context: ssl.SSLContext | None) -> None:
        self.ssl_context = ssl_context
        self._users = {user: hashed.encode() for user, hashed in spec.basic_auth_users.items()}
        self._verified: OrderedDict[bytes, None] = OrderedDict()

    @property
    def requires_auth(self) -> bool:
        """True when basic_auth_users is configured."""
        return bool(self._users)

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header satisfies basic_auth_users (always True without users)."""
        if not self._users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        token = hashlib.sha256(b"\0".join([user.encode(), password.encode(), hashed or b""])).digest()
        if hashed is not None and token in self._verified:
            self._verified.move_to_end(token)
            return True
        import bcrypt  # on the first password: an endpoint without basic_auth_users never loads it

        ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        if ok:
            self._verified[token] = None
            if len(self._verified) > _VERIFIED_CACHE_SIZE:
                self._verified.popitem(last=False)
        return ok


NO_WEB_CONFIG = WebConfig(WebConfigFile(), None)


def load_web_config(path: str | None) -> WebConfig:
    """Load and check a web config file; ConfigError names the file and key on any problem."""
    if path is None:
        return NO_WEB_CONFIG
    data = yamlfile.read(path)
    try:
        spec: WebConfigFile = build(WebConfigFile, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.path}" if exc.path else path, exc.reason) from None
    return WebConfig(spec, _ssl_context(spec.tls_server_config, path) if spec.tls_server_config else None)


def _ssl_context(tls: TlsServerConfig, path: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    where = f"{path}: tls_server_config"
    directory = os.path.dirname(path)
    cert_file, key_file = os.path.join(directory, tls.cert_file), os.path.join(directory, tls.key_file)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.cert_file", f"cannot load {cert_file} / {key_file}: {exc}") from None
    context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file:
        ca_file = os.path.join(directory, tls.client_ca_file)
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}.client_ca_file", f"cannot load {ca_file}: {exc}") from None
    return context
