"""`/generate`'s request bodies, as SGLang's `GenerateReqInput` and sampling params. Types are checked
here; value ranges by `server.protocol.SamplingParams`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

# ints are accepted, strings and bools are not
Number = StrictFloat
Stop = StrictStr | list[StrictStr] | None

# SGLang fields the embedded engine does not implement: a 400 naming the field unless unset
UNSUPPORTED_SAMPLING = ("structural_tag",)
UNSUPPORTED_GENERATE = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "lora_id",
    "custom_logit_processor",
    "return_hidden_states",
    "session_params",
    "return_routed_experts",
    "return_entropy",
    "return_sampling_mask",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "max_thinking_tokens",
    "return_indexer_topk",
    "multi_item_delimiter_indices",
    "token_indices_to_pool",
    "positional_embed_overrides",
    "watermark",
    "return_bytes",
)


class SamplingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_new_tokens: StrictInt = 128
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    stop: Stop = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = None  # gleanrl alias of sampling_seed
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    stream_interval: StrictInt | None = None
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_new_tokens: StrictInt = 0
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    structural_tag: Any = None
    logit_bias: dict[StrictStr, Number] | None = None
    stop_regex: Stop = None
    custom_params: dict[StrictStr, Any] | None = None  # accepted; no custom logit processor reads it


class GenerateIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # extras: checked against UNSUPPORTED_GENERATE, others ignored
    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: SamplingIn | list[SamplingIn] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] = -1
    top_logprobs_num: StrictInt | list[StrictInt] = 0
    token_ids_logprob: list[StrictInt] | list[list[StrictInt]] | None = None
    return_text_in_logprobs: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    require_reasoning: StrictBool = False  # the grammar held after </think> (grammar.after_reasoning)
