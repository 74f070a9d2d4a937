"""An optional extra that is not installed is refused by name with a 4xx, never a 5xx, and the server
keeps serving: xgrammar (the `grammar` extra) for every structured-output and tool-call request.
The import is blocked in the test process, which runs the server (tests/serving.py). A start-time
extra, SGLang (`gleanrl serve --backend sglang`), ends the command with one line naming what to
install and exit status 2, never a traceback. Metrics (prometheus-client), stop_regex (google-re2),
reasoning and tool-call parsing import nothing optional: they are core dependencies or plain Python."""

from __future__ import annotations

import signal
import sys

import httpx
import openai
import pytest

from serving import running_server
from test_openai_tools import MSGS, TEMPLATE, TOOLS, WEATHER


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("extras"), tokenizer=build_tokenizer(chat_template=TEMPLATE))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
        with running_server(model, tool_call_parser="qwen25", context_length=1024) as u:
            yield u


SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
CHAT = {  # every chat request that needs xgrammar
    "tools (auto)": {"tools": TOOLS},
    "named tool_choice": {"tools": TOOLS, "tool_choice": WEATHER},
    "tool_choice required": {"tools": TOOLS, "tool_choice": "required"},
    "response_format json_schema": {"response_format": SCHEMA},
    "response_format json_object": {"response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("kind", sorted(CHAT))
def test_chat_needing_xgrammar_is_refused_by_name(url, kind):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, **CHAT[kind])
    assert err.value.status_code == 400 and "gleanrl[grammar]" in str(err.value)
    ok = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
    assert ok.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("param", [{"regex": "a+"}, {"json_schema": '{"type": "object"}'}, {"ebnf": 'root ::= "a"'}])
def test_native_structured_output_without_xgrammar_is_refused_by_name(url, param):
    r = httpx.post(
        f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4, **param}}, timeout=60
    )
    assert r.status_code == 400 and "gleanrl[grammar]" in r.text
    assert (
        httpx.post(
            f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}}, timeout=60
        ).status_code
        == 200
    )


def test_sglang_backend_without_sglang_is_one_line_naming_the_install(tmp_path, capsys, monkeypatch):
    from gleanrl.cli import main
    from gleanrl.server.sglang import launch

    monkeypatch.delenv("GLEANRL_SGLANG_PYTHON", raising=False)
    monkeypatch.setattr(launch, "_REPO", tmp_path)  # no .venv-sglang beside the checkout
    monkeypatch.setitem(sys.modules, "sglang", None)  # nor in this interpreter
    model = tmp_path / "model"
    model.mkdir()
    sigterm = signal.getsignal(signal.SIGTERM)  # launch() installs its own handler
    try:
        rc = main(["serve", "--backend", "sglang", "--model", str(model), "--device", "cpu"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "Traceback" not in err[0] and "SGLang is not installed" in err[0]
    assert "pip install 'sglang[all]" in err[0] and "install_sglang_cpu.sh" in err[0]
