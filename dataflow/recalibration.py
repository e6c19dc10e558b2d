"""A new ``cascade.json`` taken up by a running job, whole or not at all.

``kascade calibrate`` writes ``cascade.json`` atomically into the model directory. A
job supervised with a recovery directory notices the new file, checks it as a start
would (:func:`~kascade.dataflow.flow.prepare`: the manifest, the heads, certified for
this run's chunking), and either refuses it in one line, the running calibration staying
in force, or drains every worker process and resumes them from the snapshot with it:
no worker runs the new heads while another runs the old ones, the records name the
calibration that settled them (``model.cascade_sha256``), the live test starts over for
the new bound, and the old calibration's suspensions no longer apply.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from kascade.dataflow.flow import Prepared, prepare
from kascade.errors import KascadeError
from kascade.schemas.cascade import CASCADE_FILE
from kascade.schemas.settings import Settings

log = logging.getLogger(__name__)


class Recalibration:
    """Compares the model directory's ``cascade.json`` with the one in force."""

    def __init__(self, settings: Settings, prepared: Prepared) -> None:
        assert settings.model_dir is not None
        self.settings = settings
        self.path = Path(settings.model_dir) / CASCADE_FILE
        self.in_force = None if prepared.in_force is None else prepared.in_force.sha256
        self._judged: set[str | None] = {self.in_force}

    def _on_disk(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None  # removed: a run without a cascade needs a restart, not a reload

    def new(self) -> Prepared | None:
        """The run prepared with a new calibration, once, when one appeared and serves
        this run; None otherwise (a refusal is said once per file)."""
        if self.settings.cascade.mode == "off":
            return None  # the run does not use a cascade, whatever the directory holds
        sha = self._on_disk()
        if sha in self._judged:
            return None
        self._judged.add(sha)
        try:
            prepared = prepare(self.settings)
        except KascadeError as e:
            self._refuse(sha, str(e))
            return None
        if prepared.in_force is None or prepared.in_force.sha256 != sha:
            self._refuse(sha, "it is not certified for this run's chunking and engine")
            return None
        self.in_force = sha
        return prepared

    def _refuse(self, sha: str | None, why: str) -> None:
        log.error(
            "refusing the new %s (sha256 %s): %s; the calibration in force (sha256 %s) stays",
            self.path,
            (sha or "?")[:12],
            why,
            (self.in_force or "none")[:12],
        )
