"""The OpenAI-compatible API: `/v1/models` (`models.py`), `/v1/completions` (`completions.py`) and
`/v1/chat/completions` (`chat.py`; its template, tools and tool-call parser), over the generation
core of `generate/` (`serve.py`: the run, the answer or the stream)."""
