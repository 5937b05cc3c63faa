"""What a model name loads: the name resolved (:func:`~pcd_engine.models.resolve.resolve_model`) on a chosen
backend, with the key that tells two names for the same weights apart from two models, and the load itself.
:meth:`pcd_engine.Engine.load` and :meth:`pcd_engine.Engine.shared` both start here."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pcd_engine.backends import select_backend
from pcd_engine.backends.contract import Backend
from pcd_engine.models.resolve import DEFAULT_MODEL, resolve_model

__all__ = ["ModelToLoad", "model_to_load"]


@dataclass(frozen=True)
class ModelToLoad:
    """A model name resolved to what loads it.

    Attributes:
        model_id: The name it was asked by (an alias, folder, file or repo id; the embedded model's alias for
            ``None``): what an engine reports as its ``model_id``.
        path: The resolved folder (or MLX repo) to load.
        backend: The backend chosen: ``"torch"`` or ``"mlx"``.
        device: The device asked for (``None``: the backend's choice).
        dtype: The precision asked for (``None``: the backend's default).
        scorer: ``"auto"``, ``"packed"`` or ``"rows"``.
    """

    model_id: str
    path: str
    backend: str
    device: str | None
    dtype: str | None
    scorer: str

    @property
    def key(self) -> tuple[str, str, str | None, str | None, str]:
        """What tells one loaded model from another: the resolved path (a real path for a local folder, so a
        trailing slash or a link is the same model), the backend, device, dtype and scorer."""
        path = os.path.realpath(self.path) if os.path.exists(self.path) else self.path
        return path, self.backend, self.device, self.dtype, self.scorer

    def load(self) -> Backend:
        """Load the weights on the chosen backend.

        Raises:
            ModelLoadError: If the model cannot be loaded.
            BackendUnavailableError: If the backend's libraries are missing.
        """
        if self.backend == "mlx":
            from pcd_engine.backends.mlx import MLXBackend

            return MLXBackend.load(self.path, device=self.device, dtype=self.dtype, scorer=self.scorer)
        from pcd_engine.backends.torch import TorchBackend

        return TorchBackend.load(self.path, device=self.device, dtype=self.dtype, scorer=self.scorer)


def model_to_load(
    name_or_path: str | os.PathLike[str] | None, *, backend: str, device: str | None, dtype: str | None, scorer: str
) -> ModelToLoad:
    """Resolve ``name_or_path`` on ``backend`` (``"auto"`` picks one), converting or fetching nothing twice.

    Raises:
        ModelLoadError: If the model cannot be found.
        BackendUnavailableError: If the backend is unknown or its libraries are missing.
    """
    chosen = select_backend(backend)
    path = resolve_model(name_or_path, backend=chosen, dtype=dtype)
    named = DEFAULT_MODEL if name_or_path is None else str(name_or_path)
    return ModelToLoad(named, path, chosen, device, dtype, scorer)
