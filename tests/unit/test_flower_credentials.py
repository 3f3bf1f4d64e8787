"""The credentials a deployment makes for its run (issue 32): the SuperLink's certificate is signed by the run's
CA for 127.0.0.1, private keys are readable by the owner only, and node keys are the EC keys in OpenSSH format
that Flower's SuperNode and ``flwr supernode register`` read."""
import ipaddress
import stat

import pytest

pytest.importorskip("flwr")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from pflkit.flower.credentials import make_credentials  # noqa: E402


def test_the_server_certificate_is_the_run_cas_for_localhost_and_the_keys_are_private(tmp_path):
    cred = make_credentials(tmp_path / "c", 2)
    ca = x509.load_pem_x509_certificate(cred.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(cred.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises when the signature or issuer does not match
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert (server.not_valid_after_utc - server.not_valid_before_utc).days == 1
    for key in (cred.server_key, tmp_path / "c/ca.key", *cred.node_keys):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for j in range(2):
        private = serialization.load_ssh_private_key(cred.node_keys[j].read_bytes(), None)
        public = serialization.load_ssh_public_key(cred.node_public_key(j).read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
    assert cred.node_public_key(0).read_bytes() != cred.node_public_key(1).read_bytes()  # a key per node
