"""gs:// inside replicas, when gs:// is kept on this machine (AIPTRAIN_GCS=local): one Cloud
Storage endpoint per installation (endpoint_server.py, in an unprivileged container that mounts
only the gcs tree) answers for www.googleapis.com and storage.googleapis.com, which resolve to
it inside every replica; replicas trust it through a CA made once for the installation.

This module is the host side's pure half: the TLS files (made once, under the home), and the
values the plan carries (what the endpoint container is, what each replica gets: environment,
read-only mounts, host names). Backends turn them into containers (docs/design/storage.md).
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from aiptrain.labels import LABEL_CODE, LABEL_INSTALLATION, LABEL_ROLE
from aiptrain.storage.local import REPLICA_IDS, give_to_replicas

# What clients hard-code: the JSON and XML APIs, and where google-auth refreshes a replica's credential.
API_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
ENDPOINT_PORT = 8443  # inside the endpoint container; replicas reach it on 443
REPLICA_PORT = 443
SERVER_CODE = Path(__file__).resolve().with_name("endpoint_server.py")
TOOLS_DIR = Path(__file__).resolve().with_name("replica_tools")  # gsutil, gcloud (storage only)

# Inside the endpoint container
ENDPOINT_CODE = "/opt/aiptrain/endpoint/server.py"
ENDPOINT_TREE = "/gcs"
ENDPOINT_TLS = "/opt/aiptrain/endpoint/tls"
# Inside every replica
REPLICA_TRUST = "/opt/aiptrain/storage/trust.pem"
REPLICA_CREDENTIALS = "/opt/aiptrain/storage/credentials.json"  # the job's project's (aiptrain.storage.projects)
REPLICA_TOOLS = "/opt/aiptrain/bin"
REPLICA_PATH = f"{REPLICA_TOOLS}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

ROLE = "storage-endpoint"

CERT_DAYS = 3650
TLS_FILES = ("trust.pem", "server.pem", "server.key")
HOSTS_FILE = "hosts"  # in the TLS dir: the names the certificate covers (a changed API_HOSTS makes new files)


@dataclass(frozen=True)
class ProjectCredential:
    """What a job's replicas carry to the endpoint: their project's credential (the token), and
    the host file that hands it to google-auth (an authorized user whose refresh token it is)."""

    project: str
    token: str
    file: str


@dataclass(frozen=True)
class StorageEndpoint:
    """The installation's storage endpoint, as a plan carries it (plain values)."""

    gcs_root: str  # host directory: the tree it serves, read-write
    tls_dir: str  # host directory holding TLS_FILES
    user: str  # uid:gid it runs as: the replicas' user, so what it writes is theirs
    installation: str
    images: tuple[str, ...]  # the first one the engine has runs it (any image with Python 3.7+)

    @property
    def name(self) -> str:
        return f"aiptrain-storage-{self.installation[:8]}" if self.installation else "aiptrain-storage"

    @property
    def labels(self) -> dict[str, str]:
        owner = {LABEL_INSTALLATION: self.installation} if self.installation else {}
        return {**owner, LABEL_ROLE: ROLE, LABEL_CODE: code_digest()}

    @property
    def command(self) -> list[str]:
        return self.command_on(ENDPOINT_PORT)

    def command_on(self, port: int) -> list[str]:
        """The server's command line, listening on `port` (a swarm's replicas reach it on its own
        address, so there it listens on REPLICA_PORT itself)."""
        return ["python3", ENDPOINT_CODE, "--root", ENDPOINT_TREE, "--port", str(port),
                "--cert", f"{ENDPOINT_TLS}/server.pem", "--key", f"{ENDPOINT_TLS}/server.key"]

    def mounts(self) -> list[tuple[str, str, bool]]:
        """(host path, container path, read-only) of the endpoint container: the tree, its code, its key."""
        return [(self.gcs_root, ENDPOINT_TREE, False), (str(SERVER_CODE), ENDPOINT_CODE, True),
                (self.tls_dir, ENDPOINT_TLS, True)]

    def prepare_files(self) -> None:
        """Its gcs tree and TLS files, made once (`prepare_files`): before its container starts."""
        prepare_files(Path(self.tls_dir), Path(self.gcs_root))

    def replica_mounts(self) -> list[tuple[str, str]]:
        """(host path, replica path), read-only: the CA bundle replicas trust, and the tools."""
        return [(f"{self.tls_dir}/trust.pem", REPLICA_TRUST), (str(TOOLS_DIR), REPLICA_TOOLS)]


# Set on a replica started while the endpoint is still starting (the first job after a quiet
# spell), to HOST:PORT of the endpoint: the engine starts the replica meanwhile, and its bootstrap
# runs the trainer once the endpoint listens, so the trainer's first gs:// request finds it.
AWAIT_ENDPOINT = "AIPTRAIN_AWAIT_ENDPOINT"
AWAIT_ENDPOINT_SECONDS = 60  # more than the backend gives the endpoint to start before failing the launch
# `python3 -m MODULE ARGS...` run by the trainer's own interpreter (runpy: the same argv and
# sys.path[0]) once a TCP connection to the endpoint succeeds: it listens from when it says it
# serves, which is what replicas started after it waited for. Not a TLS handshake, which cost
# what starting early gained (docs/design/storage.md). Whatever the host itself serves on the
# port (which a connection reaches before the endpoint's port is published) rules this out:
# DockerBackend.launch looks first. No second interpreter, and no name left in the trainer's
# __main__. The shell gets it in double quotes: no ", $, ` or \.
AWAIT_THEN_RUN_MODULE = f"""
def _get_ready(address):
    import os, socket, sys, time
    if not getattr(sys.flags, 'safe_path', False):
        sys.path[0] = os.getcwd()  # what -m puts first, where -c puts ''
    host, port = address.rsplit(':', 1)
    deadline = time.monotonic() + {AWAIT_ENDPOINT_SECONDS}
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((host, int(port)), 0.5).close()
        except OSError:
            time.sleep(0.02)
    print('aiptrain: the storage endpoint did not answer at', address, '- gs:// may fail', file=sys.stderr)
_get_ready(__import__('os').environ.pop('{AWAIT_ENDPOINT}'))
del _get_ready
__import__('runpy')._run_module_as_main(__import__('sys').argv.pop(1))
"""


def replica_env(credential: ProjectCredential | None) -> dict[str, str]:
    """What makes every client in a replica talk to the endpoint as its job's project: Google's
    host names resolve to it; google-auth (google-cloud-storage, gcsfs) reads the project's
    credentials file, TensorFlow's GCS file system its token; no metadata server; the CA bundle
    for curl, OpenSSL and requests. google-cloud-cpp / tensorflow-io take the endpoint from
    CLOUD_STORAGE_EMULATOR_ENDPOINT. A plan made before projects owned buckets (no credential)
    keeps the anonymous emulator settings, which the endpoint now refuses (401)."""
    endpoint = f"https://{API_HOSTS[1]}"
    caller = {"GOOGLE_APPLICATION_CREDENTIALS": REPLICA_CREDENTIALS, "GOOGLE_AUTH_TOKEN_FOR_TESTING": credential.token,
              "GOOGLE_CLOUD_PROJECT": credential.project} if credential else \
        {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "aiptrain-local",
         "GOOGLE_CLOUD_PROJECT": "aiptrain-local"}
    return {
        **caller,
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,
        "NO_GCE_CHECK": "true",
        "CURL_CA_BUNDLE": REPLICA_TRUST,
        "SSL_CERT_FILE": REPLICA_TRUST,
        "REQUESTS_CA_BUNDLE": REPLICA_TRUST,
        "PATH": REPLICA_PATH,
    }


TLS_DIR_NAME = "storage-endpoint"  # in the home: the endpoint's certificate, key and the bundle replicas trust


def code_digest() -> str:
    return hashlib.sha256(SERVER_CODE.read_bytes()).hexdigest()[:12]


def prepare_files(tls_dir: Path, gcs_root: Path) -> None:
    """What the endpoint needs before it first starts in a home, made once: the gcs tree, and
    the TLS files (its certificate and key, and the bundle replicas trust: a CA made for this
    installation, then the public roots of certifi). The CA's own key is never written anywhere:
    it signs the endpoint's certificate and is gone, so nothing else can ever be signed with it.
    When aiptrain runs as root, the endpoint and the replicas run as `nobody`: the key is theirs,
    and what the host wrote in the tree before becomes theirs to write beside, before the TLS
    files that say it is done are written. Submit's staging and the backend starting the
    endpoint both call it, whichever comes first: one makes the files, the other waits for them."""
    if _tls_current(tls_dir):
        return

    gcs_root.mkdir(parents=True, exist_ok=True)
    tls_dir.mkdir(parents=True, exist_ok=True)
    with open(tls_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _tls_current(tls_dir):
            give_to_replicas(gcs_root, gcs_root, whole_tree=True)
            _write_tls(tls_dir, REPLICA_IDS if os.getuid() == 0 else None)
            _write(tls_dir / HOSTS_FILE, " ".join(API_HOSTS).encode(), 0o644, None)


def _tls_current(tls_dir: Path) -> bool:
    """Whether the TLS files are there and their certificate covers every name in API_HOSTS."""
    try:
        return all((tls_dir / name).is_file() for name in TLS_FILES) and \
            (tls_dir / HOSTS_FILE).read_text() == " ".join(API_HOSTS)
    except OSError:
        return False


def _write_tls(tls_dir: Path, owner: tuple[int, int] | None) -> None:
    import certifi
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"aiptrain local storage CA {os.urandom(4).hex()}")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(host) for host in (*API_HOSTS, "localhost")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, API_HOSTS[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _write(tls_dir / "server.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()), 0o600, owner)
    _write(tls_dir / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644, None)
    _write(tls_dir / "trust.pem", ca_pem + b"\n" + Path(certifi.where()).read_bytes(), 0o644, None)


def _write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    if owner is not None:
        os.chown(partial, *owner)
    os.replace(partial, path)
