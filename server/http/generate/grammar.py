"""Structured output: SGLang's `json_schema` / `regex` / `ebnf` and OpenAI's `response_format` compiled by xgrammar
(as SGLang) for the engine's masks (`server.sampling.grammar`). Bounded: one grammar per request, its source <=
`MAX_GRAMMAR_BYTES`, compiled one at a time on its own thread within `COMPILE_TIMEOUT_S` (else a 400; it finishes in
the background, cached), <= `MAX_COMPILED_BYTES`; every failure a 400 naming the field. With a reasoning model a
grammar may hold only the answer (`after_reasoning`, as SGLang's `ReasonerGrammarObject`)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from gleanrl.server.http.edge.errors import ApiError, bad_field
from gleanrl.server.http.generate.reasoning import END, THINK, ReasoningParser

MAX_GRAMMAR_BYTES = 64 * 1024  # a schema, regex or EBNF grammar
MAX_COMPILED_BYTES = 64 << 20  # the compiled grammar (xgrammar's token masks)
COMPILE_TIMEOUT_S = 10.0
KINDS = ("json_schema", "regex", "ebnf")
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")


def xgrammar():
    """The xgrammar module, or a 400 naming the extra to install."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ApiError(
            400,
            "structured output (json_schema, regex, ebnf, response_format, tools, tool_choice) needs xgrammar: "
            "pip install 'gleanrl[grammar]' (or scripts/setup.sh)",
            param="xgrammar",
        ) from None
    return xgr


def _compiler(state):
    """One xgrammar compiler per app (its cache shared by requests)."""
    if state.grammar_compiler is None:
        xgr = xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(
            state.tokenizer, vocab_size=state.vocab_size, stop_token_ids=state.stop_token_ids
        )
        state.grammar_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=4 * MAX_COMPILED_BYTES)
    return state.grammar_compiler


def _grammar(xgr, kind: str, source: str, cfg):
    """xgrammar's Grammar of a request's json_schema / regex / ebnf, with SGLang's JSON options."""
    if kind == "json_schema":
        if source == "$$ANY$$":
            return xgr.Grammar.builtin_json_grammar()
        return xgr.Grammar.from_json_schema(
            source,
            any_whitespace=not cfg.constrained_json_disable_any_whitespace,
            max_whitespace_cnt=cfg.constrained_json_max_whitespace_cnt,
        )
    return xgr.Grammar.from_regex(source) if kind == "regex" else xgr.Grammar.from_ebnf(source)


def _compile(compiler, kind: str, source: str, cfg):
    if kind == "structural_tag":  # tool_choice required / named (openai/tools.py), after_reasoning
        return compiler.compile_structural_tag(source)
    return compiler.compile_grammar(_grammar(xgrammar(), kind, source, cfg))


def grammar_source(values: dict, prefix: str = "") -> tuple[str, str, str] | None:
    """(kind, source, field) of the one grammar set among SGLang's fields, or None."""
    given = [k for k in KINDS if values.get(k) not in (None, "")]
    if len(given) > 1:
        raise bad_field(f"{prefix}{given[1]}", "only one of json_schema, regex, ebnf may be set")
    if not given:
        return None
    kind, field = given[0], f"{prefix}{given[0]}"
    source = values[kind]
    if kind == "json_schema" and isinstance(source, dict):
        source = json.dumps(source)
    if not isinstance(source, str):
        raise ApiError(400, f"{field} must be a string", param=field)
    if len(source.encode()) > MAX_GRAMMAR_BYTES:
        raise bad_field(field, f"{len(source.encode())} bytes, over the limit of {MAX_GRAMMAR_BYTES}")
    return kind, source, field


def response_format_source(fmt) -> tuple[str, str, str] | None:
    """OpenAI's response_format -> (kind, source, field): text None, json_object the schema
    `{"type": "object"}` (as SGLang), json_schema its `schema`."""
    if fmt in (None, {}) or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return "json_schema", '{"type": "object"}', "response_format"
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_field("response_format.json_schema.schema", "a JSON schema object is required")
        return grammar_source({"json_schema": json.dumps(schema)}, "response_format.")
    raise ApiError(400, "response_format.type must be text, json_object or json_schema", param="response_format.type")


async def _on_pool(field: str, kind: str, fn, *args):
    """fn(*args) on the compile thread within COMPILE_TIMEOUT_S; errors a 400 naming the field."""
    future = asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)
    try:
        return await asyncio.wait_for(asyncio.shield(future), COMPILE_TIMEOUT_S)
    except TimeoutError:
        raise bad_field(field, f"the grammar took longer than {COMPILE_TIMEOUT_S:g} s to compile") from None
    except Exception as exc:  # xgrammar's parse errors (RuntimeError, ValueError, ...)
        raise bad_field(field, f"invalid {kind}: {str(exc)[:300]}") from None


async def compile_grammar(state, spec: tuple[str, str, str] | None):
    """The CompiledGrammar of `spec` (grammar_source's), or None."""
    if spec is None:
        return None
    kind, source, field = spec
    compiled = await _on_pool(field, kind, _compile, _compiler(state), kind, source, state.server_cfg)
    if compiled.memory_size_bytes > MAX_COMPILED_BYTES:
        raise bad_field(
            field,
            f"the compiled grammar holds {compiled.memory_size_bytes} bytes, over the limit of {MAX_COMPILED_BYTES}",
        )
    return compiled


def reasoning_mode(parser: str | None, opened: bool) -> str | None:
    """Where a reasoning model's output starts (`opened`: the template ended the prompt with <think>):
    "forced" inside the reasoning, "optional" where it may open with <think>; None without a parser."""
    if parser is None:
        return None
    return "forced" if ReasoningParser(parser, opened).in_reasoning else "optional"


def required_reasoning(parser: str | None, required: bool, specs: list) -> str | None:
    """/generate's `require_reasoning` -> "forced" (as SGLang, whatever the parser), or None. SGLang
    without a reasoning parser ignores it; here a 400 when it would hold a grammar."""
    if required and parser is None and any(specs):
        raise bad_field(
            "require_reasoning",
            "holding the grammar after the reasoning needs the server started with --reasoning-parser",
        )
    return "forced" if required else None


def after_think(fmt: dict, reasoning: str, gap: str | None = None) -> dict:
    """The structural-tag format `fmt` after free text up to </think> (opened by <think> unless
    `reasoning` is "forced"; "optional": `fmt` alone also); `gap`: a regex allowed between them."""
    begin = "" if reasoning == "forced" else THINK
    think = {"type": "tag", "begin": begin, "content": {"type": "any_text"}, "end": END}
    then = {"type": "sequence", "elements": [think, *([{"type": "regex", "pattern": gap}] if gap else []), fmt]}
    return then if reasoning == "forced" else {"type": "or", "elements": [then, fmt]}


def _answer_tag(xgr, kind: str, source: str, reasoning: str, cfg) -> str:
    """The structural tag of a grammar held after the reasoning; its content the same grammar as EBNF
    (a structural tag's own json_schema has no any_whitespace switch)."""
    answer = {"type": "grammar", "grammar": str(_grammar(xgr, kind, source, cfg))}
    return json.dumps({"type": "structural_tag", "format": after_think(answer, reasoning)})


async def after_reasoning(state, spec: tuple[str, str, str] | None, reasoning: str | None):
    """`spec` (grammar_source's) held only after the reasoning (`reasoning_mode`'s), from the token
    after </think>, as SGLang's ReasonerGrammarObject; unchanged without a grammar or reasoning."""
    if spec is None or reasoning is None:
        return spec
    kind, source, field = spec
    tag = await _on_pool(field, kind, _answer_tag, xgrammar(), kind, source, reasoning, state.server_cfg)
    return "structural_tag", tag, field
