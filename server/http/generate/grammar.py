"""Structured output at the edge: SGLang's `json_schema` / `regex` / `ebnf` sampling parameters and
OpenAI's `response_format` compiled by xgrammar (the library SGLang uses) into the `CompiledGrammar`
the engine masks with (`server.sampling.grammar`).

Bounded before any work: one grammar per request, its source at most `MAX_GRAMMAR_BYTES`; compiles run
one at a time on their own thread (never on the event loop or the decode thread), each within
`COMPILE_TIMEOUT_S` (else a 400; the compile finishes in the background and is cached), and the
compiled grammar at most `MAX_COMPILED_BYTES`. Every failure is a 400 naming the field.

With a reasoning model a grammar may hold only the answer (`after_reasoning`, as SGLang's
`ReasonerGrammarObject`): a structural tag whose reasoning is free up to `</think>`."""

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
    """The xgrammar module, or a 400 naming the extra to install (an optional extra: refused by
    name, never ignored, never a 5xx)."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ApiError(
            400,
            "structured output (json_schema, regex, ebnf, response_format, "
            "tools, tool_choice) needs xgrammar: pip install 'gleanrl[grammar]' (or "
            "scripts/setup.sh)",
            param="xgrammar",
        ) from None
    return xgr


def _compiler(state):
    """One xgrammar compiler per app (its cache shared by requests), over the server's tokenizer
    and the model's vocabulary size."""
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
    """(kind, source, field) of the one grammar set among SGLang's fields, None if none is;
    a 400 when several are set or the value is not a string within the size limit."""
    given = [k for k in KINDS if values.get(k) not in (None, "")]
    if len(given) > 1:
        raise ApiError(
            400, f"{prefix}{given[1]}: only one of json_schema, regex, ebnf may be set", param=f"{prefix}{given[1]}"
        )
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
    """OpenAI's response_format -> (kind, source, field): text (None), json_object (a JSON object:
    the schema `{"type": "object"}`, as SGLang's OpenAI adapter maps it), json_schema (its
    `schema`)."""
    if fmt in (None, {}) or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return "json_schema", '{"type": "object"}', "response_format"
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                400,
                "response_format.json_schema.schema: a JSON schema object is required",
                param="response_format.json_schema.schema",
            )
        return grammar_source({"json_schema": json.dumps(schema)}, "response_format.")
    raise ApiError(400, "response_format.type must be text, json_object or json_schema", param="response_format.type")


async def _on_pool(field: str, kind: str, fn, *args):
    """fn(*args) on the compile thread within COMPILE_TIMEOUT_S; xgrammar's errors a 400 naming the
    field."""
    future = asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)
    try:
        return await asyncio.wait_for(asyncio.shield(future), COMPILE_TIMEOUT_S)
    except TimeoutError:
        raise bad_field(field, f"the grammar took longer than {COMPILE_TIMEOUT_S:g} s to compile") from None
    except Exception as exc:  # xgrammar's parse errors (RuntimeError, ValueError, ...)
        raise bad_field(field, f"invalid {kind}: {str(exc)[:300]}") from None


async def compile_grammar(state, spec: tuple[str, str, str] | None):
    """The CompiledGrammar of `spec` (grammar_source's), or None; a 400 naming the field when the
    source is invalid, the compile too slow or its result too large."""
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
    """Where a reasoning model's output starts (`--reasoning-parser`; `opened`: the chat template
    ended the prompt with <think>): "forced" inside the reasoning, "optional" where it may open
    with a <think> block; None without a parser."""
    if parser is None:
        return None
    return "forced" if ReasoningParser(parser, opened).in_reasoning else "optional"


def required_reasoning(parser: str | None, required: bool, specs: list) -> str | None:
    """/generate's `require_reasoning` -> the reasoning its grammars wait for: "forced" (SGLang's
    ReasonerGrammarObject then starts inside the reasoning, whatever the parser), None when unset.
    SGLang without a reasoning parser ignores the field; here a 400 when it would hold a grammar."""
    if required and parser is None and any(specs):
        raise ApiError(
            400,
            "require_reasoning: holding the grammar after the reasoning needs the server started "
            "with --reasoning-parser",
            param="require_reasoning",
        )
    return "forced" if required else None


def after_think(fmt: dict, reasoning: str, gap: str | None = None) -> dict:
    """The structural-tag format `fmt` after the reasoning: free text up to </think> (opened by
    <think> unless `reasoning` is "forced"; "optional": `fmt` alone also), then `fmt` from the next
    character on (`gap`: a regex allowed between them)."""
    think = {
        "type": "tag",
        "begin": "" if reasoning == "forced" else THINK,
        "content": {"type": "any_text"},
        "end": END,
    }
    then = {"type": "sequence", "elements": [think, *([{"type": "regex", "pattern": gap}] if gap else []), fmt]}
    return then if reasoning == "forced" else {"type": "or", "elements": [then, fmt]}


def _answer_tag(xgr, kind: str, source: str, reasoning: str, cfg) -> str:
    """The structural tag of a request grammar held after the reasoning: its content is the same
    grammar as without reasoning, as EBNF (a structural tag's own json_schema has no
    any_whitespace switch)."""
    answer = {"type": "grammar", "grammar": str(_grammar(xgr, kind, source, cfg))}
    return json.dumps({"type": "structural_tag", "format": after_think(answer, reasoning)})


async def after_reasoning(state, spec: tuple[str, str, str] | None, reasoning: str | None):
    """`spec` (grammar_source's) held only after the reasoning (`reasoning_mode`'s), as SGLang's
    ReasonerGrammarObject with a reasoning parser: the reasoning free, the grammar from the token
    after </think>. Unchanged when there is no grammar or no reasoning."""
    if spec is None or reasoning is None:
        return spec
    kind, source, field = spec
    return (
        "structural_tag",
        await _on_pool(field, kind, _answer_tag, xgrammar(), kind, source, reasoning, state.server_cfg),
        field,
    )
