"""The endpoint's web_config (exporter-toolkit format): TLS, mTLS, basic auth, bad files."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from tpuwatch.schema import ConfigError
from tpuwatch.webconfig import load_web_config

from certs import TlsFiles, make_tls_files
from conftest import SIM_FAST, DaemonProcess, wait_until

PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def web_config(path: Path, tls: TlsFiles | None = None, client_auth: str | None = None,
               users: dict[str, str] | None = None) -> Path:
    data: dict = {}
    if tls is not None:
        data["tls_server_config"] = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
        if client_auth:
            data["tls_server_config"] |= {"client_auth_type": client_auth, "client_ca_file": str(tls.ca_cert)}
    if users:
        data["basic_auth_users"] = users
    path.write_text(yaml.safe_dump(data))
    return path


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def test_tls_and_basic_auth(start_daemon: Callable[..., DaemonProcess], tls: TlsFiles, tmp_path: Path) -> None:
    web = web_config(tmp_path / "web.yml", tls, users={"prometheus": hashed(PASSWORD)})
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    url = f"https://127.0.0.1:{daemon.port}"
    daemon.wait_ready(scheme="https", verify=str(tls.ca_cert))
    assert requests.get(f"{url}/metrics", verify=str(tls.ca_cert), timeout=5).status_code == 401
    wrong = requests.get(f"{url}/metrics", verify=str(tls.ca_cert), auth=("prometheus", "nope"), timeout=5)
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith("Basic")
    assert requests.get(f"{url}/metrics", verify=str(tls.ca_cert), auth=("nobody", PASSWORD),
                        timeout=5).status_code == 401
    good = requests.get(f"{url}/metrics", verify=str(tls.ca_cert), auth=("prometheus", PASSWORD), timeout=5)
    assert good.status_code == 200 and "tpuwatch_device_up" in good.text
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5)
    assert PASSWORD not in daemon.log()


def test_mutual_tls(start_daemon: Callable[..., DaemonProcess], tls: TlsFiles, tmp_path: Path) -> None:
    web = web_config(tmp_path / "web.yml", tls, client_auth="RequireAndVerifyClientCert")
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    url = f"https://127.0.0.1:{daemon.port}/metrics"
    client = (str(tls.client_cert), str(tls.client_key))
    wait_until(lambda: requests.get(url, verify=str(tls.ca_cert), cert=client, timeout=2).ok, what="mTLS scrape")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=str(tls.ca_cert), timeout=5)
    # One failed handshake does not disturb the next scrape.
    assert requests.get(url, verify=str(tls.ca_cert), cert=client, timeout=5).status_code == 200


def test_reload_turns_on_basic_auth(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    assert requests.get(f"{daemon.url}/metrics", timeout=5).status_code == 200
    web = web_config(tmp_path / "web.yml", users={"ops": hashed(PASSWORD)})
    daemon.write_config({**SIM_FAST, "listen": f"127.0.0.1:{daemon.port}", "web_config": str(web)})
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: requests.get(f"{daemon.url}/metrics", timeout=2).status_code == 401, what="auth on reload")
    assert requests.get(f"{daemon.url}/metrics", auth=("ops", PASSWORD), timeout=5).status_code == 200


@pytest.mark.parametrize("content,message", [
    ("basic_auth_users: {ops: plaintext}", "basic_auth_users.ops: expected a bcrypt hash"),
    ("tls_server_config: {cert_file: /nonexistent.pem, key_file: /nonexistent.key}", "cert_file: cannot load"),
    ("tls_server_config: {key_file: k}", "tls_server_config.cert_file: required key missing"),
    ("tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAnyClientCert}",
     "tls_server_config.client_auth_type: must be one of"),
    ("http2: true", "http2: unknown key"),
    ("basic_auth_users: [", "YAML syntax error"),
])
def test_bad_web_configs_name_the_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_web_config(str(path))
    assert message in str(caught.value)


def test_basic_auth_checker(tmp_path: Path) -> None:
    web = load_web_config(str(web_config(tmp_path / "web.yml", users={"ops": hashed(PASSWORD)})))
    header = "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    assert web.authorized(header) and web.authorized(header)
    assert not web.authorized("Basic " + base64.b64encode(b"ops:wrong").decode())
    assert not web.authorized("Basic !!!notbase64")
    assert not web.authorized(None)


def test_an_endpoint_without_users_never_loads_bcrypt(tmp_path: Path) -> None:
    # Every host pays for what the daemon imports; bcrypt is for endpoints with basic_auth_users only.
    code = ("import sys\nfrom tpuwatch.webconfig import load_web_config\n"
            f"web = load_web_config({str(web_config(tmp_path / 'web.yml'))!r})\n"
            "assert web.authorized(None)\nprint('bcrypt' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout == "False\n", out.stderr
