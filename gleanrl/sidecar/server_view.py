"""What `gleanrl harvest` reads from the rollout server (or `gleanrl proxy`): the harvest feed with a
cursor, the server's load (for idle windows) and the policy it serves, which the sidecar follows by
loading `/model_info`'s `model_path` again whenever (`model_path`, `weight_version`) changes. Weights sent
by `update_weights_from_tensor` or `_distributed` reach no directory the sidecar could read: when the
feed's latest policy update is one of those, or `model_path` is no model directory on this machine (the
sidecar needs the trainer's checkpoints on a shared filesystem), following stops with `FollowError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import httpx

FOLLOWABLE = ("disk",)


class FollowError(RuntimeError):
    """The sidecar cannot follow the server's policy; the message says why and what to do."""


@dataclass(slots=True)
class Policy:
    model_path: str
    weight_version: str
    version: int  # the sidecar's policy version (HarvestHooks: step - 1), 0, 1, ...


@dataclass
class ServerView:
    url: str
    admin_api_key: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    cursor: int = 0
    feed_id: str | None = None
    versions: dict[str, int] = field(default_factory=dict)  # "model_path|weight_version" -> policy version
    missed: int = 0  # records the feed dropped before the sidecar read them

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout_s)

    def _get(self, path: str, **params) -> dict:
        key = (self.admin_api_key or self.api_key) if path == "/harvest_feed" else self.api_key  # SGLang's levels
        resp = self._http.get(path, params=params, headers={"Authorization": f"Bearer {key}"} if key else {})
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:300]
            raise FollowError(f"{self.url}{path}: HTTP {resp.status_code}: {message}")
        return resp.json()

    def read(self, wait_s: float = 0.0) -> dict:
        """The next page of the feed (`records`, `load`); advances the cursor and counts what was missed."""
        page = self._get("/harvest_feed", cursor=self.cursor, wait_s=wait_s)
        if page["feed_id"] != self.feed_id:
            if self.feed_id is not None:  # a restarted server: its feed starts again at 0
                page = self._get("/harvest_feed", cursor=0)
            self.feed_id = page["feed_id"]
        self.missed += page["missed"]
        self.cursor = page["next_cursor"]
        last = page["weight_updates"][-1] if page["weight_updates"] else None  # how the policy served now came
        if last is not None and last["kind"] not in FOLLOWABLE:
            raise FollowError(
                f"the policy was updated by update_weights_from_{last['kind']} (weight_version "
                f"{last['weight_version']}): those weights never reach a directory the sidecar can read, so it "
                "cannot follow them; update the policy with update_weights_from_disk"
            )
        return page

    def policy(self) -> Policy:
        """The policy the server serves now, numbered in the order the sidecar first saw each one."""
        info = self._get("/model_info")
        path, weight_version = str(info.get("model_path")), str(info.get("weight_version"))
        if not (Path(path) / "config.json").is_file():
            raise FollowError(
                f"the server's model_path {path!r} is not a model directory on this machine: run the sidecar "
                "where the trainer's checkpoints are (a shared filesystem)"
            )
        key = f"{path}|{weight_version}"
        if key not in self.versions:
            self.versions[key] = max(self.versions.values(), default=-1) + 1
        return Policy(path, weight_version, self.versions[key])

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "feed_id": self.feed_id, "versions": dict(self.versions), "missed": self.missed}

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.feed_id = int(state["cursor"]), state["feed_id"]
        self.versions, self.missed = dict(state["versions"]), int(state["missed"])

    def close(self) -> None:
        self._http.close()
