"""Policy pushes to every rollout server: each checkpoint checked against each server's serving model before
anything is sent, then sent by the route safe for the server's kind (`clients.weight_sync`). The reference is the
serving model's directory (`/model_info` `model_path`) where readable here, else the trainer's initial `--model`.
Stock SGLang applies what it is given: a truncated file kills it, another architecture's weights load as success.
"""

from __future__ import annotations

from pathlib import Path

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.weight_sync import Route, probe_all, push_policy
from gleanrl.harvest.checkpoint_check import CheckpointMismatch, check_policy_checkpoint


def serving_reference(model_path: str | None, fallback: str | Path) -> Path:
    """The serving model's directory if readable here (same host or shared volume), else `fallback`."""
    if model_path and (Path(model_path) / "config.json").is_file():
        return Path(model_path)
    return Path(fallback)


class PolicyPusher:
    def __init__(self, client: RolloutClient, initial_model: str | Path):
        self.client, self.initial_model = client, Path(initial_model)
        self.routes: dict[str, Route] = {}  # the last push's route per worker URL (for logs and tests)

    async def push(self, path: str, version: str) -> None:
        """Raises CheckpointMismatch (nothing sent) or RolloutServerError."""
        kinds = await probe_all(self.client)
        for kind in kinds:
            try:
                check_policy_checkpoint(path, serving_reference(kind.model_path, self.initial_model))
            except CheckpointMismatch as exc:
                raise CheckpointMismatch(f"refusing to push the policy to {kind.url}: {exc}") from None
        self.routes = await push_policy(self.client, path, version, kinds)
