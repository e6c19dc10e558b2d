"""How a job's processes are restarted and how those of a job over several hosts find,
watch and drain each other: the ``restarts`` and ``cluster`` sections of the run settings.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import CliSuppress

from kascade.errors import UsageError


class RestartSettings(BaseModel):
    """How ``kascade run --recovery-dir`` brings back worker processes that died."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(
        default=5,
        ge=0,
        description="Restarts in a row before the job gives up and exits; 0: never restart.",
    )
    backoff_s: float = Field(
        default=1.0, gt=0, le=3600, description="Wait before the first restart; doubles."
    )
    backoff_max_s: float = Field(
        default=60.0, gt=0, le=3600, description="The longest wait between restarts."
    )
    healthy_after_s: float = Field(
        default=300.0, gt=0, description="A run this long resets the count and the wait."
    )
    quarantine_after: int = Field(
        default=2,
        ge=1,
        description="Worker deaths on one record before it is dead-lettered, not retried.",
    )


class ClusterSettings(BaseModel):
    """How the processes of one job spread over several hosts find and watch each other."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="How long a process waits for its peers to join the cluster before it"
        " exits non-zero naming the missing ones (an orchestrator then restarts it).",
    )
    control_port_offset: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Each process answers its peers' state and drain requests on its"
        " address's port plus this (HTTP).",
    )
    # A secret: from the environment (KASCADE_CLUSTER__CONTROL_TOKEN) or a file, never a
    # flag (argv is visible to every user of a host).
    control_token: CliSuppress[SecretStr | None] = None
    control_token_file: Path | None = Field(
        default=None,
        description="File holding the token the cluster's processes drain each other with"
        " (a mounted Secret); or set KASCADE_CLUSTER__CONTROL_TOKEN.",
    )
    control_host: str | None = Field(
        default=None,
        description="Address the control port binds. Default: the process's own address"
        " when it is an IP, else every interface; on Kubernetes, the pod's IP"
        " (status.podIP).",
    )

    def token(self) -> str | None:
        """The control token, read from its file when one is named (UsageError when it
        cannot be read or is empty)."""
        if self.control_token_file is None:
            return None if self.control_token is None else self.control_token.get_secret_value()
        try:
            text = self.control_token_file.read_text().strip()
        except OSError as e:
            raise UsageError(f"cluster.control_token_file: cannot read it: {e.strerror}") from None
        if not text:
            raise UsageError(f"cluster.control_token_file: {self.control_token_file} is empty")
        return text
