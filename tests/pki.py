"""A CA and certificates made with openssl, in a folder of the caller's own: the TLS tests and the
soak (tests/soak.py, which renews the services' certificate while they run)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess

import grpc


class PKI:
    """A CA and certificates made with openssl, in a folder of the test's own."""

    def __init__(self, path) -> None:
        self.path = str(path)
        self.ca = self._ca("ca")

    def _run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.path, check=True, capture_output=True)

    def _ca(self, name: str) -> str:
        self._run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                  "-out", f"{name}.crt", "-subj", f"/CN={name}", "-days", "2")
        return os.path.join(self.path, f"{name}.crt")

    def issue(self, name: str, cn: str, san: str, ca: str = "ca") -> tuple[str, str]:
        with open(os.path.join(self.path, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        self._run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                  "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        self._run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                  "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
        return os.path.join(self.path, f"{name}.crt"), os.path.join(self.path, f"{name}.key")

    def issue_expired(self, name: str, cn: str, san: str) -> None:
        """A certificate from the CA whose validity ended in 2020 (``openssl ca`` sets past dates)."""
        with open(os.path.join(self.path, "ca.cnf"), "w") as f:
            f.write("[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\nnew_certs_dir=.\nserial=serial\n"
                    "default_md=sha256\npolicy=p\ncopy_extensions=copy\n[p]\ncommonName=supplied\n")
        open(os.path.join(self.path, "index.txt"), "w").close()
        with open(os.path.join(self.path, "serial"), "w") as f:
            f.write("1000\n")
        with open(os.path.join(self.path, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        self._run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                  "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        self._run("ca", "-batch", "-config", "ca.cnf", "-in", f"{name}.csr", "-out", f"{name}.crt", "-cert", "ca.crt",
                  "-keyfile", "ca.key", "-startdate", "20200101000000Z", "-enddate", "20200102000000Z",
                  "-extfile", f"{name}.ext", "-notext")

    def credentials(self, client: str | None = None) -> grpc.ChannelCredentials:
        ca = open(self.ca, "rb").read()
        if client is None:
            return grpc.ssl_channel_credentials(ca)
        base = os.path.join(self.path, client)
        return grpc.ssl_channel_credentials(ca, open(base + ".key", "rb").read(), open(base + ".crt", "rb").read())


def served_certificate(port: int, ca: str) -> bytes:
    """The certificate (DER) a TLS server on the loopback ``port`` serves, verified against ``ca``:
    a new handshake, so a server that reloads its files on handshakes serves its current ones."""
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def der(path: str) -> bytes:
    """A PEM certificate file's DER bytes."""
    return ssl.PEM_cert_to_DER_cert(open(path).read())
