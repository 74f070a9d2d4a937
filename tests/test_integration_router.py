"""`gleanrl train --router URL --server W1 --server W2`: generation goes through the router (here a
minimal forwarding router like sglang-router, which routes `/generate` only), weight updates go to
every worker directly, never to the router."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.loop import train
from gleanrl.trainer.tasks.base import Task
from tests.serving import running_server


def router_app(workers: list[str], log: list[tuple[str, str]]) -> Starlette:
    turn = itertools.cycle(workers)
    http = httpx.AsyncClient(timeout=120)

    async def generate(request: Request):
        worker = next(turn)
        log.append((request.url.path, worker))
        upstream = await http.send(
            http.build_request(
                "POST", worker + "/generate", content=await request.body(), headers={"content-type": "application/json"}
            ),
            stream=True,
        )

        async def body():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(
            body(), status_code=upstream.status_code, media_type=upstream.headers.get("content-type")
        )

    async def health(request: Request):
        return Response(status_code=200)

    async def other(request: Request):
        log.append((request.url.path, ""))
        return JSONResponse({"error": {"message": "not routed"}}, status_code=404)

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/health", health),
            Route("/{path:path}", other, methods=["GET", "POST"]),
        ]
    )


@contextmanager
def running_router(workers: list[str]):
    log: list[tuple[str, str]] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(router_app(workers, log), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", log
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


class LetterTask(Task):
    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        return [{"prompt": f"say {chr(97 + (seed + i) % 26)}"} for i in range(n)]

    def reward(self, sample: dict, response: str) -> float:
        return float(sample["prompt"][-1] in response)


def test_client_generates_through_the_router_and_updates_workers():
    client = RolloutClient(["http://w1/", "http://w2"], router="http://router/")
    assert client.pick_url() == "http://router" and client.urls == ["http://w1", "http://w2"]


def test_train_generates_through_the_router_and_pushes_to_every_worker(tiny_qwen2, tmp_path):
    with running_server(tiny_qwen2) as w1, running_server(tiny_qwen2) as w2, running_router([w1, w2]) as (router, log):
        cfg = TrainConfig(
            model=str(tiny_qwen2),
            out=str(tmp_path / "run"),
            servers=[w1, w2],
            router=router,
            steps=2,
            prompts_per_step=2,
            samples_per_prompt=2,
            max_new_tokens=8,
            seed=0,
        )
        row = train(cfg, task=LetterTask(), log=lambda *a: None)
        versions = [httpx.get(f"{w}/model_info", timeout=30).json()["weight_version"] for w in (w1, w2)]
    assert row["step"] == 2 and versions == ["2", "2"]
    # only generation went through the router
    assert [p for p, _ in log] == ["/generate"] * 8
    assert {w for _, w in log} == {w1, w2}
