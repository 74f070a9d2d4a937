"""The chat template over request messages and tools, in a worker thread (chat and /tokenize)."""

from __future__ import annotations

import asyncio

from gleanrl.server.http.edge.errors import ApiError, bad_field
from gleanrl.server.http.openai.bodies import ChatMessage
from gleanrl.server.http.openai.tools import history


def _messages(raw: list[ChatMessage]) -> list[dict]:
    """Pydantic chat messages -> the template's dicts (text parts joined; tool calls and answers kept)."""
    messages = []
    for k, m in enumerate(raw):
        content = m.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise bad_field(f"messages.{k}.content", "only text parts are supported")
            content = "".join(str(part.get("text", "")) for part in content)
        extra = {key: v for key in ("tool_calls", "tool_call_id", "name") if (v := getattr(m, key)) is not None}
        messages.append({"role": m.role, "content": content or "", **extra})
    return history(messages)


async def chat_text(
    state,
    raw: list[ChatMessage],
    template_kwargs: dict | None = None,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
) -> str:
    """The prompt's text; a 400 when there is no template or it rejects the messages."""
    messages = _messages(raw)
    kwargs = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    try:
        return await asyncio.to_thread(
            state.tokenizer.apply_chat_template,
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except Exception as exc:  # no template, or the template rejects these messages
        raise ApiError(400, f"messages: the chat template failed: {exc}", param="messages") from None
