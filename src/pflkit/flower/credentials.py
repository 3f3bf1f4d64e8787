"""Credentials for a deployment, made for the run: TLS between the SuperLink and its SuperNodes, and the
SuperNodes' authentication keys (Flower's own mechanisms, ``flower-superlink --ssl-* --enable-supernode-auth``,
``flower-supernode --root-certificates --auth-supernode-private-key``, ``flwr supernode register``).

``make_credentials(folder, n)`` writes, in ``folder`` (private keys readable by the owner only):

* ``ca.crt`` / ``ca.key``: a certificate authority that exists for this run only (EC P-384, valid a day);
* ``server.crt`` / ``server.key``: the SuperLink's certificate, signed by that CA, for 127.0.0.1 and
  localhost (the SuperNodes and ``flwr`` verify it against ``ca.crt``);
* ``node-<j>`` / ``node-<j>.pub``: SuperNode j's key pair (EC P-384, OpenSSH format, which Flower reads);
  the public keys are registered with the SuperLink before the SuperNodes start, so a node whose key was
  not registered is refused.

Real certificates (a CA the machines trust, a server name other than 127.0.0.1) go in through
``Credentials`` (``Deployment(credentials=...)``): any PEM files with the same roles work.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 1


@dataclass(frozen=True)
class Credentials:
    """Paths of a deployment's credentials: the CA certificate the clients trust, the SuperLink's certificate
    and key, and one OpenSSH private key per SuperNode (its public key beside it, ``.pub``)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: tuple[Path, ...]

    def node_public_key(self, j: int) -> Path:
        return self.node_keys[j].with_suffix(".pub")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def node_key(path: Path) -> Path:
    """A new SuperNode key pair: ``path`` (OpenSSH private key, mode 600) and ``path.pub``; returns ``path``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                       serialization.PublicFormat.OpenSSH))
    return path


def make_credentials(folder: Path, num_nodes: int) -> Credentials:
    """A CA, the SuperLink's certificate for 127.0.0.1/localhost and ``num_nodes`` SuperNode key pairs, in
    ``folder`` (created)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pflkit run CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA384()))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                               x509.DNSName("localhost")]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .sign(ca_key, hashes.SHA384()))
    paths = Credentials(folder / "ca.crt", folder / "server.crt", folder / "server.key",
                        tuple(folder / f"node-{j}" for j in range(num_nodes)))
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(folder / "ca.key", pem_key(ca_key))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths.server_key, pem_key(server_key))
    for path in paths.node_keys:
        node_key(path)
    return paths
