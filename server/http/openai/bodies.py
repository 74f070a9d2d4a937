"""The OpenAI routes' request bodies: OpenAI's fields plus SGLang's extras. Types are checked here; value
ranges by `server.protocol.SamplingParams`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gleanrl.server.http.generate.bodies import Number, Stop

# SGLang fields the embedded engine does not implement (`edge.errors.refuse_unsupported`)
UNSUPPORTED_OPENAI = (
    "functions",
    "function_call",
    "structural_tag",
    "lora_path",
    "return_hidden_states",
    "custom_logit_processor",
    "audio",
    "prediction",
)
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # the chat route's only


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class OpenAISampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, plus SGLang's extras)."""

    model_config = ConfigDict(extra="allow")  # extras: checked against UNSUPPORTED_OPENAI, others ignored
    model: StrictStr | None = None  # any name: the served model, echoed (SGLang)
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: StrictInt | None = None
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    user: StrictStr | None = None
    top_k: StrictInt = -1
    min_p: Number = 0.0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    rid: StrictStr | None = None
    repetition_penalty: Number = 1.0  # SGLang's extra sampling fields
    min_tokens: StrictInt = 0
    logit_bias: dict[StrictStr, Number] | None = None
    stop_regex: Stop = None
    custom_params: dict[StrictStr, Any] | None = None


class CompletionIn(OpenAISampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None  # up to --max-top-logprobs-num (SGLang: no limit)


class ChatMessage(BaseModel):
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (history)
    tool_call_id: StrictStr | None = None  # a tool message's answer to one
    name: StrictStr | None = None


class ChatIn(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    separate_reasoning: StrictBool = True  # with --reasoning-parser (SGLang's fields)
    stream_reasoning: StrictBool = True
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
